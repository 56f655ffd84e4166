#!/bin/sh
# gpu/h200.sh STEP: one step of a GPU-tier session on the lent H200, run from the root of a
# checkout that carries the bundle in .gpu-stage (make gpu-bundle [LINE=...]); results go to
# $OUT.
#   stage N install bundle stage N into /tmp/site (what one call carries is limited);
#           stage1 is stage 1
#   prep    (the 0.5.17 line, call 1 of 3) install stage 1, train the tiny models into
#           $S/models with the image's torch and transformers (the proven training path);
#           FAMILY_HEADS=1: the target with the family's MLA head dims (qk 192, v 128), which
#           FlashInfer's SM90 MLA prefill needs for a tier with ATTENTION=flashinfer
#   tier    (the 0.5.17 line, call 3 of 3, after `stage 2`) install the stages carried and
#           not yet installed, start the line's six configurations, run the GPU tests, then
#           the benchmark at C = 16, 32, 64, 128 (2 runs); servers left running for `bench`;
#           ATTENTION=flashinfer: every server on FlashInfer attention (after FAMILY_HEADS=1 prep),
#           no benchmark (its kernels compile as the servers start; `bench` follows)
#   measure (the 0.5.17 line) install the stages carried and not yet installed, train, start
#           the line's configurations (gpu/engines.py LINE_LABELS), benchmark them side by
#           side, profile at batch 128; servers left running for `bench`
#   tests   install stage 2, train the models, start the servers (left running), GPU tests
#   bench   the throughput benchmark and profiles against the running servers, then stop them
#   large   the benchmark and profiles on the larger dummy-weight models (gpu/large_models.py),
#           after stage 1 and stage 2 (stage 3 carried or installed): three servers at a time
#           (LARGE_LABELS), BENCH_ROUNDS requests per worker and level (NO_BENCH=1: the
#           profiles only), within BUDGET_S s
#   profile install stage 2, train, start baseline and EAGLE-3 v2 (+ threshold), profile, stop
#   deep    baseline and EAGLE-3 v2 + threshold on the larger models with a 36-layer target,
#           after stage 1 and stage 2: two servers at a time
#   quick   after stage 1 and stage 2 (stage 3 carried): train, the GPU tests and the step at
#           batch 128 on QUICK_LABELS (baseline and the flag)
# The machine keeps /tmp and the servers for 30 s after a call: run the steps back to back.
set -u
SITE=/tmp/site
S=/tmp/gpu-session
B=.gpu-stage
OUT=${OUT:-$S/out}
mkdir -p "$OUT"
# dsl_packages: where the optional cutlass group's `cutlass` lives (a .pth adds it in a
# site-packages, not in a --target folder); bin: ninja for the JIT builds of the 0.5.17 line
export PYTHONUNBUFFERED=1 PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages
export PATH=$SITE/bin:$PATH
install_stage() {  # install_stage N: once per machine
    [ -f "$SITE/.stage$1" ] && { echo "h200.sh: stage $1 already installed"; return 0; }
    sh $B/install.sh $B/stage$1 $SITE && touch "$SITE/.stage$1"
}
collect() {  # collect SESSION_DIR PREFIX: at most 7 files (8 come back from a call)
    for f in session.log pytest.log bench.md bench.json; do
        [ -f "$1/$f" ] && cp "$1/$f" "$OUT/$2$f"
    done
    # the profiles in one file, each under a "==> profile-LABEL.txt <==" line, and in logs.tgz
    profiles=$(cd "$1" && ls profile-*.txt 2>/dev/null)
    for f in $profiles; do echo "==> $f <=="; cat "$1/$f"; echo; done > "$OUT/${2}profiles.txt"
    [ -n "$profiles" ] || rm -f "$OUT/${2}profiles.txt"
    tar czf "$OUT/${2}logs.tgz" --exclude='target/model.safetensors' -C "$1" logs models \
        $profiles 2>/dev/null
}
install_carried() {  # every stage this call carries that is not installed yet
    for d in $B/stage[0-9]*; do
        [ -d "$d" ] || continue  # none carried (a second tier): the glob stays unexpanded
        n=${d##*/stage}
        install_stage "$n" >> "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 9; }
    done
}
stop_servers() {  # the servers a tier left running (they hold the GPU's memory)
    [ -f $S/servers.json ] || return 0
    python3 -c "import json, os, sys
for s in json.load(open(sys.argv[1])).values():
    try: os.killpg(s['pid'], 9)
    except ProcessLookupError: pass" $S/servers.json
    sleep 5
}
# the labels of either line (session.py profiles those it started)
PROFILED=baseline,eagle3-v2,eagle3-v1+threshold,eagle3-v2+threshold,eagle3-v2+threshold-skip,eagle3-v2+threshold-full,eagle3-v2+adaptive,eagle3-v2+threshold-config
case ${1:-} in
stage1)
    install_stage 1 ;;
stage)
    install_stage "${2:?usage: h200.sh stage N}" ;;
prep)
    install_stage 1 > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 9; }
    mkdir -p $S
    (cd $B/repo && timeout 400 python3 gpu/train_models.py --out $S/models \
        ${FAMILY_HEADS:+--family-heads}) > "$OUT/train.log" 2>&1
    rc=$?
    cp $S/models/training.json "$OUT/" 2>/dev/null
    tail -3 "$OUT/train.log"
    exit $rc ;;
tier)
    test -d $SITE/sglang || { echo "h200.sh: stage 1 is not installed: run prep first"; exit 8; }
    install_carried
    if [ -f $S/servers.json ]; then  # a second tier: stop the first one's servers, keep its results apart
        stop_servers
        mkdir -p $S/previous
        for f in servers.json bench.json bench.md pytest.log; do
            [ -f $S/$f ] && mv $S/$f $S/previous/
        done
    fi
    # FlashInfer compiles its kernels as the servers start (4-5 of the call's minutes): its
    # tier leaves the benchmark to `bench`, so the tests get the rest of the call
    bench="--bench-runs 2 --bench-concurrency 16,32,64,128"
    [ "${ATTENTION:-triton}" = flashinfer ] && bench=--no-bench
    (cd $B/repo && timeout 550 python3 gpu/session.py --out $S --keep-servers --budget-s 535 \
        $bench --attention-backend ${ATTENTION:-triton})
    rc=$?
    collect $S ""
    tail -60 "$S/pytest.log" 2>/dev/null
    cat "$S/bench.md" 2>/dev/null
    exit $rc ;;
measure)
    test -d $SITE/sglang || { echo "h200.sh: stage 1 is not installed: run stage 1 first"; exit 8; }
    install_carried
    (cd $B/repo && timeout 570 python3 gpu/session.py --out $S --no-tests --keep-servers \
        --budget-s 555 --bench-runs 2 --bench-concurrency 1,4,8,16,32,64,128 \
        --profile baseline,eagle3-v2,eagle3-v2+threshold,eagle3-v2+adaptive)
    rc=$?
    collect $S ""
    cat "$S/bench.md" 2>/dev/null
    exit $rc ;;
tests)
    test -d $SITE/sglang || { echo "h200.sh: stage 1 is not installed: run stage1 first"; exit 8; }
    sh $B/install.sh $B/stage2 $SITE > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 9; }
    (cd $B/repo && timeout 570 python3 gpu/session.py --out $S --budget-s 555 --no-bench --keep-servers)
    rc=$?
    collect $S ""
    tail -45 "$S/pytest.log" 2>/dev/null
    exit $rc ;;
bench)
    (cd $B/repo && timeout 570 python3 gpu/session.py --out $S --attach --no-tests --stop \
        --budget-s 550 --bench-runs 3 --profile $PROFILED)
    rc=$?
    collect $S ""
    cat "$S/bench.md" 2>/dev/null
    exit $rc ;;
large)
    test -d $SITE/sglang || { echo "h200.sh: stage 1 is not installed: run stage1 first"; exit 8; }
    install_carried
    stop_servers
    # three 13 GB targets fit an H100 (80 GB) when each server's fraction only gates its start
    # (--max-total-tokens caps the KV pool): LARGE_LABELS picks which three
    budget=${BUDGET_S:-550}  # less where the session's device time is short: $OUT comes back
    (cd $B/repo && PATCHKIT_GPU_MEM_FRACTION=${PATCHKIT_GPU_MEM_FRACTION:-0.8} \
        timeout $((budget + 20)) python3 gpu/session.py --out $S-large --large --no-tests \
        --stop --budget-s $budget ${NO_BENCH:+--no-bench} \
        --bench-runs 3 --bench-concurrency 16,32,64,128 --bench-rounds ${BENCH_ROUNDS:-6} \
        --profile $PROFILED --labels ${LARGE_LABELS:-baseline,eagle3-v2+threshold,eagle3-v2+threshold-full})
    rc=$?
    collect $S-large large-
    cat "$S-large/bench.md" 2>/dev/null
    exit $rc ;;
quick)
    test -d $SITE/sglang || { echo "h200.sh: stage 1 is not installed: run stage1 first"; exit 8; }
    install_carried
    stop_servers
    # the tier's checks and the step at batch 128 on two servers (QUICK_LABELS), training
    # the tiny models unless prep did: one call after stage 1 and stage 2
    (cd $B/repo && timeout 560 python3 gpu/session.py --out $S --budget-s 540 \
        --bench-runs 2 --bench-concurrency 128 \
        --labels ${QUICK_LABELS:-baseline,eagle3-v2+threshold} \
        --profile ${QUICK_LABELS:-baseline,eagle3-v2+threshold})
    rc=$?
    collect $S quick-
    tail -25 "$S/pytest.log" 2>/dev/null
    grep -h "profile" "$S/session.log"
    exit $rc ;;
profile)
    test -d $SITE/sglang || { echo "h200.sh: stage 1 is not installed: run stage1 first"; exit 8; }
    sh $B/install.sh $B/stage2 $SITE > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 9; }
    (cd $B/repo && timeout 570 python3 gpu/session.py --out $S-profile --no-tests --no-bench \
        --budget-s 550 --labels baseline,eagle3-v2,eagle3-v2+threshold \
        --profile baseline,eagle3-v2,eagle3-v2+threshold)
    rc=$?
    collect $S-profile profile-
    grep -h "profile" "$S-profile/session.log"
    exit $rc ;;
deep)
    test -d $SITE/sglang || { echo "h200.sh: stage 1 is not installed: run stage1 first"; exit 8; }
    install_carried
    (cd $B/repo && PATCHKIT_GPU_MEM_FRACTION=${PATCHKIT_GPU_MEM_FRACTION:-0.93} timeout 430 \
        python3 gpu/session.py --out $S-deep --large --large-layers 36 --no-tests --stop \
        --budget-s 420 --bench-runs 2 --bench-concurrency 64,128 \
        --labels baseline,eagle3-v2+threshold --profile baseline,eagle3-v2+threshold)
    rc=$?
    collect $S-deep deep-
    cat "$S-deep/bench.md" 2>/dev/null
    exit $rc ;;
*)
    echo "usage: h200.sh stage1|stage N|prep|tier|measure|tests|bench|large|quick|profile|deep" >&2
    exit 2 ;;
esac
