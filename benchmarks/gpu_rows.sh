#!/usr/bin/env bash
# The GPU rows of BENCHMARKS.md, in groups that each fit one call on the lent GPU machine (< 10 minutes):
#
#     bash benchmarks/gpu_rows.sh one_call|targets|jobs|attention|train|eval|tests [OUT_DIR]
#
# targets: what the GPU evaluation issue still measures, in one call (~6 minutes): the CUDA tests first, then the
#        identity and one-head rows of attention_overhead.py (25 rounds) on BERT-base and RoBERTa with --groups (a layer
#        with drop_* heads as one SDPA call and as one call per group, in the same rounds) and on DeBERTa-v2, the kernels
#        of that one head under drop_intra against stock's (profile_plan.py: where its extra time goes), then the whole
#        table on BERT-base (--groups) and BERT-large; needs pytest's wheels (below);
# one_call: what the GPU evaluation issue measures, in one call of the lent machine (~6 minutes, each section under
#        its own time limit so that a slow one loses only itself): eval_speed.py throughput (mode=eval's pass vs a
#        plain loop over its own DataLoader, BERT-base, bf16-mixed, 9,815 rows), attention_overhead.py on BERT-base and
#        BERT-large shapes, the CUDA tests, sweep_heads alone over 9,815 rows, attention_overhead.py on RoBERTa,
#        DeBERTa-v2 and ModernBERT (BERT-base shapes); needs pytest's wheels (below);
# jobs: every ablate.py mode that evaluates, end to end with trainer=gpu on the tiny model (eval under drop_intra and
#        under resample, sweep_heads, importance, shapley), each job's last lines and exit status (~2 min;
#        TRAINER=cpu tries it on the CPU, JOB_LIMIT=S limits each job to S seconds, default 90);
# attention: attention_overhead.py on BERT-base and BERT-large shapes, bf16 (~4 min);
# train: train_throughput.py on the BERT-base shape, bf16-mixed, no plan / one head pruned / half uniform (~6 min);
# eval: eval_speed.py sweep (144 heads, 9,815 rows) and throughput on the BERT-base shape, bf16-mixed (~8 min);
# tests: the CUDA-only attention tests (no host sync under every policy, exact against the float64 reference); needs
#        pytest, which the machine's image may lack: `pip download -d .whl pytest pluggy iniconfig` here first.
# Each benchmark's output goes to OUT_DIR/NAME.log (default: $OUT, what the device tool brings back, else gpu-logs/).
# Run it after the set-up line of ../shared/gpu/README.md (wheels on PYTHONPATH).
set -euo pipefail
group=${1:-}
case "$group" in
    one_call|targets|jobs|attention|train|eval|tests) ;;
    *) echo "error: group must be one of one_call, targets, jobs, attention, train, eval, tests; got '$group'" >&2
       exit 2 ;;
esac
out=${2:-${OUT:-gpu-logs}}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/machine.log" 2>&1 || true
python3 -c "import torch, transformers; print(torch.__version__, torch.version.cuda, transformers.__version__)" \
    >> "$out/machine.log"

run() {  # NAME ARGS...: one benchmark, its output to NAME.log (also shown)
    local name=$1; shift
    echo "== $name: python3 $*"
    python3 "$@" 2>&1 | tee "$out/$name.log" | tail -n 16
}

section() {  # LOG LIMIT ARGS...: one benchmark under a time limit, its output appended to LOG.log
    local log=$1 limit=$2; shift 2
    echo "== $log (limit ${limit}s): python3 $*" | tee -a "$out/$log.log"
    timeout "$limit" python3 "$@" >> "$out/$log.log" 2>&1
    echo "exit status $?" >> "$out/$log.log"
    tail -n 14 "$out/$log.log"
}

cuda_tests() {  # LIMIT: the CUDA-only attention tests, their failures in full, to tests.log
    (cd .. && timeout "$1" python3 -m pytest -o addopts= -q -ra -p no:cacheprovider \
        tests/test_attention_contract.py -k cuda > "$out/tests.log" 2>&1; echo "exit status $?" >> "$out/tests.log")
    tail -n 20 "$out/tests.log"
}

case "$group" in
    targets)
        cuda_tests 120
        for family in bert roberta deberta-v2; do
            groups=(); [[ $family == deberta-v2 ]] || groups=(--groups)
            section one_head 60 attention_overhead.py --device cuda --dtype bfloat16 --shape bert-base \
                --family "$family" --only "identity,one head" --rounds 25 --repeat 3 "${groups[@]}"
        done
        section profile 45 profile_plan.py --device cuda --dtype bfloat16 --shape bert-base --heads L6H0 \
            --policy drop_intra --rows 14
        section attention 80 attention_overhead.py --device cuda --dtype bfloat16 --shape bert-base --rounds 9 \
            --repeat 3 --groups
        section attention 75 attention_overhead.py --device cuda --dtype bfloat16 --shape bert-large --rounds 7 \
            --repeat 3 ;;
    one_call)
        section eval 150 eval_speed.py throughput --device cuda --precision bf16-mixed --shape bert-base \
            --task demo_pairs --rows 9815 --batch 128 --rounds 5
        for shape in bert-base bert-large; do
            section attention 75 attention_overhead.py --device cuda --dtype bfloat16 --shape "$shape" --rounds 9 \
                --repeat 3
        done
        cuda_tests 150
        section sweep 150 eval_speed.py sweep --only sweep_heads --device cuda --precision bf16-mixed \
            --shape bert-base --task demo_pairs --rows 9815 --batch 128 --rounds 1
        for family in roberta deberta-v2 modernbert; do
            section attention 45 attention_overhead.py --device cuda --dtype bfloat16 --shape bert-base \
                --family "$family" --rounds 9 --repeat 3
        done ;;
    jobs)
        jobs_dir=$(mktemp -d)
        common=(model=tiny_random task=demo_pairs allow_random_head=true data.max_eval_examples=64 logger=csv
                "trainer=${TRAINER:-gpu}")
        runs=("mode=eval mask=drop_intra mask.heads=L0" "mode=eval mask=resample mask.heads=L1 mask.reference_examples=32"
              "mode=sweep_heads mask.policy=drop_inter" "mode=importance" "mode=shapley shapley.over=layers")
        for i in "${!runs[@]}"; do
            # shellcheck disable=SC2086  # each run's words
            section jobs "${JOB_LIMIT:-90}" ../ablate.py ${runs[$i]} "${common[@]}" "hydra.run.dir=$jobs_dir/$i"
        done ;;
    attention)
        for shape in bert-base bert-large; do
            run "attention-$shape" attention_overhead.py --device cuda --dtype bfloat16 --shape "$shape" \
                --rounds 9 --repeat 3
        done ;;
    train)
        for plan in none one_head_prune half_uniform; do
            run "train-$plan" train_throughput.py --device cuda --precision bf16-mixed --shape bert-base \
                --plan "$plan" --rounds 7 --steps 30
        done ;;
    eval)
        run eval-sweep eval_speed.py sweep --device cuda --precision bf16-mixed --shape bert-base \
            --task demo_pairs --rows 9815 --batch 128 --rounds 1
        run eval-throughput eval_speed.py throughput --device cuda --precision bf16-mixed --shape bert-base \
            --task demo_pairs --rows 9815 --batch 128 --rounds 3 ;;
    tests)
        python3 -c "import pytest" 2>/dev/null || {
            echo "error: pytest is not installed here; put its wheels in .whl (pip download -d .whl pytest pluggy iniconfig)" >&2
            exit 2
        }
        cd ..
        python3 -m pytest -o addopts= -q -ra -p no:cacheprovider tests/test_attention_contract.py -k cuda 2>&1 \
            | tee "$out/tests.log" | tail -n 30 ;;
esac
