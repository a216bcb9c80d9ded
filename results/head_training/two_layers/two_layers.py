"""Experiment only: a two-layer eagle3 head (layer1.* after layer.*), the second layer starting as
the identity (o_proj, down_proj zero). Patches the training code in-process."""
import speculant  # noqa
import torch
import speculant.models.head as H
import speculant.training.trainer as TR
import speculant.training.objective as OB

_shapes = H.head_weight_shapes
def shapes(arch, variant, with_layer=True, draft_vocab=0):
    s = _shapes(arch, variant, with_layer, draft_vocab)
    if with_layer:
        s |= {"layer1." + k[6:]: v for k, v in s.items() if k.startswith("layer.")}
    return s
H.head_weight_shapes = shapes

_llama = H._llama_layer
def block(weights, arch, linear):
    l0 = H.LlamaBlock(arch, _llama(weights, arch, linear))
    w1 = {("layer." + k[7:] if k.startswith("layer1.") else "x" + k): v for k, v in weights.items()}
    l1 = H.LlamaBlock(arch, _llama(w1, arch, linear))
    def run(x, cos, sin, attend):
        return l1(l0(x, cos, sin, attend), cos, sin, attend)
    return run
H._block = block

_ts = TR.trained_start
def trained_start(head, fresh, kind):
    if any(k.startswith("layer1.") for k in head.weights):
        return _ts(head, fresh, kind)
    base = {k: v for k, v in fresh.items() if not k.startswith("layer1.")}
    out = _ts(head, base, kind)
    for k, v in list(out.items()):
        if k.startswith("layer."):
            w = v.clone()
            if k.endswith("o_proj.weight") or k.endswith("down_proj.weight"):
                w.zero_()
            out["layer1." + k[6:]] = w
    return out
TR.trained_start = trained_start

_attend = OB.HeadObjective._attend
def attend(self, batch, step, history):
    if not isinstance(history, dict) and not hasattr(history, "per_layer"):
        pass
    # per-layer histories kept on the shared list object
    if not hasattr(self, "_hist") or self._hist[0] is not history:
        self._hist = (history, [[], []])
    per = self._hist[1]
    fns = [_attend(self, batch, step, per[i]) for i in range(2)]
    calls = [0]
    def run(q, k, v):
        i = calls[0] % 2
        calls[0] += 1
        return fns[i](q, k, v)
    return run
OB.HeadObjective._attend = attend
