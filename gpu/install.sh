#!/bin/sh
# install.sh STAGE_DIR [SITE]: check a bundle stage's sha256 sums, join the wheels that travel
# in parts once their last part is there, then install the stage's wheels into SITE (default
# /tmp/site) with pip, offline and without dependency resolution, and byte-compile SITE in
# parallel (each server process would otherwise compile on import).
# Parts wait in PARTS_DIR (default /tmp/gpu-parts) between calls; a stage's PARTS file lists
# "<sha256 of the whole>  <wheel>  <number of parts>" for each wheel it holds a part of.
set -eu
stage=$1
site=${2:-/tmp/site}
parts=${PARTS_DIR:-/tmp/gpu-parts}
(cd "$stage" && sha256sum -c --quiet SHA256SUMS)
joined=""
if [ -f "$stage/PARTS" ]; then
    mkdir -p "$parts"
    cp "$stage"/*.part[0-9]* "$parts"/
    while read -r sum wheel count; do
        i=1
        missing=""
        while [ "$i" -le "$count" ]; do
            [ -f "$parts/$wheel.part$i" ] || missing="$missing $i"
            i=$((i + 1))
        done
        if [ -n "$missing" ]; then
            echo "install.sh: $wheel: waiting for part(s)$missing"
            continue
        fi
        i=1
        : > "$parts/$wheel"
        while [ "$i" -le "$count" ]; do
            cat "$parts/$wheel.part$i" >> "$parts/$wheel"
            i=$((i + 1))
        done
        echo "$sum  $wheel" | (cd "$parts" && sha256sum -c --quiet -) || {
            echo "install.sh: $wheel: joined parts do not give the pinned sha256 $sum" >&2
            rm -f "$parts/$wheel"
            exit 1
        }
        joined="$joined $parts/$wheel"
    done < "$stage/PARTS"
fi
set -- "$stage"/*.whl $joined
[ -e "$1" ] || shift  # a stage of parts only
if [ $# -gt 0 ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --disable-pip-version-check --target "$site" "$@"
    python3 -m compileall -q -j 0 "$site" > /dev/null 2>&1 || true
fi
echo "install.sh: $# wheels from $stage into $site"
