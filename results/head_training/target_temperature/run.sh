# From the repository root, with runs/f1 (the full-mix data stages of docs/results/mtp_head.md) and
# runs/f1ttt/train/head (its unroll-2 head) on disk: 200 unroll-2 steps from that head per target
# temperature, then teacher-forced agreement on the MT-bench first turns (answers kept in runs/agree_mtb).
export OMP_NUM_THREADS=2
for T in 1.0 0.5 0.2; do
  out=runs/tt/t$T; mkdir -p $out
  for f in hidden responses.jsonl; do [ -e $out/$f ] || ln -s ../../f1/$f $out/$f; done
  python results/head_training/target_temperature/target_temperature.py $T train-head --model smollm2-135m \
    --data runs/f1/mix.jsonl --max-prompts 7000 --responses self --max-new-tokens 128 --gen-batch 128 \
    --variant eagle3 --draft-vocab 8192 --validate-prompts 0 --out $out --unroll 2 --steps 200 --batch-tokens 2048 \
    --lr 5e-4 --warmup-steps 10 --checkpoint-every 100 --heldout 100 --head-dtype bfloat16 --init-head runs/f1ttt/train/head
  python -m speculant.training.agreement --head $out/train/head --prompts ../shared/data/mt_bench/question.jsonl \
    --out runs/agree_mtb --output runs/tt/agree_t$T.json
done
