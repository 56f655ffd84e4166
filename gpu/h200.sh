#!/bin/sh
# gpu/h200.sh STEP: one step of a GPU-tier session on the lent H200, run from the root of a
# checkout that carries the bundle in .gpu-stage (make gpu-bundle); results go to $OUT.
#   stage1  install bundle stage 1 into /tmp/site (what one call carries is limited)
#   tests   install stage 2, train the models, start the servers (left running), GPU tests
#   bench   the throughput benchmark against the running servers, then stop them
# The machine keeps /tmp and the servers for 30 s after a call: run the steps back to back.
set -u
SITE=/tmp/site
S=/tmp/gpu-session
B=.gpu-stage
OUT=${OUT:-$S/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$SITE
collect() {
    for f in session.log pytest.log bench.md bench.json; do
        [ -f "$S/$f" ] && cp "$S/$f" "$OUT/"
    done
    tar czf "$OUT/logs.tgz" --exclude='target/model.safetensors' -C "$S" logs models 2>/dev/null
}
case ${1:-} in
stage1)
    sh $B/install.sh $B/stage1 $SITE ;;
tests)
    test -d $SITE/sglang || { echo "h200.sh: stage 1 is not installed: run stage1 first"; exit 8; }
    sh $B/install.sh $B/stage2 $SITE > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 9; }
    (cd $B/repo && timeout 570 python3 gpu/session.py --out $S --budget-s 555 --no-bench --keep-servers)
    rc=$?
    collect
    tail -45 "$S/pytest.log" 2>/dev/null
    exit $rc ;;
bench)
    (cd $B/repo && timeout 540 python3 gpu/session.py --out $S --attach --no-tests --stop --budget-s 520 --bench-runs 3)
    rc=$?
    collect
    cat "$S/bench.md" 2>/dev/null
    exit $rc ;;
*)
    echo "usage: h200.sh stage1|tests|bench" >&2
    exit 2 ;;
esac
