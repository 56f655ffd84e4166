#!/bin/sh
# install.sh STAGE_DIR [SITE]: check a bundle stage's sha256 sums, then install its wheels
# into SITE (default /tmp/site) with pip, offline and without dependency resolution, and
# byte-compile SITE in parallel (each server process would otherwise compile on import).
set -eu
stage=$1
site=${2:-/tmp/site}
(cd "$stage" && sha256sum -c --quiet SHA256SUMS)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --disable-pip-version-check --target "$site" "$stage"/*.whl
python3 -m compileall -q -j 0 "$site" > /dev/null 2>&1 || true
echo "install.sh: $(ls "$stage"/*.whl | wc -l) wheels from $stage into $site"
