"""Tensor parallelism: the target and its draft heads sharded over ranks of one torch.distributed
group (gloo on CPU, NCCL on CUDA); the leader (rank 0) schedules, proposes and broadcasts each
forward's plan, every rank runs it (`leader.py`, `worker.py`)."""
