"""Renderers of the review model: `terminal.render` (plain text) and `html.render` (one page)."""
