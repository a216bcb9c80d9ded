"""llama.cpp's cost of a T-row forward (a verify) against one row, same GGUF, after 300 tokens."""
import sys, time, statistics, json
import llama_cpp
path = sys.argv[1]
llm = llama_cpp.Llama(model_path=path, n_ctx=1024, n_threads=1, n_threads_batch=1, logits_all=True, verbose=False, n_batch=64)
prompt = [1 + (i * 37) % 20000 for i in range(300)]
llm.eval(prompt)
res = {}
for T in (1, 2, 5, 8):
    times = []
    for r in range(12):
        llm.n_tokens = 300
        toks = [100 + r + i for i in range(T)]
        t = time.process_time(); llm.eval(toks); times.append(time.process_time() - t)
    res[T] = min(times) * 1e3
print(json.dumps({T: round(v, 2) for T, v in res.items()}), {T: round(v / res[1], 2) for T, v in res.items()})
