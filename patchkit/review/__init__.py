"""The upstream-diff review: a model built from the series, rendered for a terminal or as HTML."""

from patchkit.review.model import (
    PatchRow,
    RangeEntry,
    Review,
    SeriesComparison,
    TargetReview,
    build_review,
    compare_series,
)

__all__ = [
    "PatchRow",
    "RangeEntry",
    "Review",
    "SeriesComparison",
    "TargetReview",
    "build_review",
    "compare_series",
]
