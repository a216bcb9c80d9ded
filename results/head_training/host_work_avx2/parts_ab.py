"""Old and new forms of a k = 1 step's host pieces, interleaved, min over repeats (us)."""
import speculant
import time, torch, statistics
import torch.nn.functional as F
from speculant.sampling.acceptance import accept_greedy, pad_ragged, AcceptResult
from speculant.sampling.sampler import argmax_tokens

def old_accept_greedy(draft_token_ids, num_draft, target_argmax):
    k_max = draft_token_ids.shape[1]
    num_draft = num_draft.to(draft_token_ids.device, torch.int64)
    valid = torch.arange(k_max, device=draft_token_ids.device)[None, :] < num_draft[:, None]
    num_accepted = ((draft_token_ids == target_argmax[:, :k_max]) & valid).long().cumprod(-1).sum(-1)
    final = target_argmax.gather(1, num_accepted[:, None])[:, 0]
    padded = F.pad(draft_token_ids, (0, 1), value=-1)
    pos = torch.arange(padded.shape[1], device=padded.device)
    out = torch.where(pos[None, :] < num_accepted[:, None], padded, torch.full_like(padded, -1))
    token_ids = out.scatter_(1, num_accepted[:, None], final[:, None])
    return AcceptResult(token_ids=token_ids, num_emitted=num_accepted + 1, num_accepted=num_accepted)

V, Nk = 49152, 8192
logits = torch.randn(2, V); drafts = torch.tensor([[int(logits[0].argmax())]]); ks = [1]
vm = torch.sort(torch.randperm(V)[:Nk]).values; sc = torch.randn(2, Nk)
def old_accept():
    counts = torch.tensor([k + 1 for k in ks])
    am = pad_ragged(logits.argmax(-1), counts, drafts.shape[1] + 1)
    return old_accept_greedy(drafts, torch.tensor(ks), am)
def new_accept():
    rows = torch.tensor([[0 + min(j, k) for j in range(2)] for b, k in enumerate(ks)])
    return accept_greedy(drafts, torch.tensor(ks), argmax_tokens(logits)[rows])
pairs = {
    "argmax of 1 row of logits": (lambda: logits[:1].argmax(-1), lambda: argmax_tokens(logits[:1])),
    "argmax of 2 rows": (lambda: logits.argmax(-1), lambda: argmax_tokens(logits)),
    "head logits into the vocabulary": (lambda: sc.new_full((2, V), float("-inf")).index_copy_(1, vm, sc),
                                        lambda: sc.new_full((2, V), float("-inf")).scatter_(1, vm.expand(2, -1), sc)),
    "greedy acceptance (argmax, pad, accept)": (old_accept, new_accept),
}
a, b = old_accept(), new_accept()
assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.num_accepted, b.num_accepted)
res = {k: ([], []) for k in pairs}
for rep in range(15):
    for k, (fo, fn) in pairs.items():
        for i, f in enumerate((fo, fn)):
            for _ in range(20): f()
            t = time.perf_counter()
            for _ in range(300): f()
            res[k][i].append((time.perf_counter() - t) / 300 * 1e6)
print("| piece | before (us) | after (us) |\n|---|---|---|")
for k, (o, n) in res.items():
    print(f"| {k} | {min(o):.0f} (median {statistics.median(o):.0f}) | {min(n):.0f} (median {statistics.median(n):.0f}) |")
