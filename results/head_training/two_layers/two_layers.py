"""An experiment, not a head variant: an eagle3 head with two decoder layers (`layer1.*` after
`layer.*`), patched into the training code in-process. Started from a one-layer head, the new
layer is a copy of its layer with `o_proj` and `down_proj` zero, so it starts as the identity.

    python two_layers.py train-head ...   (speculant's command, two-layer heads)
    python two_layers.py agreement ...    (python -m speculant.training.agreement, the same)
"""

import sys

import speculant  # noqa: F401  (before torch)
import speculant.models.head as head
import speculant.training.objective as objective
import speculant.training.trainer as trainer

NEW = "layer1."  # the second layer's weight names


def shapes(arch, variant, with_layer=True, draft_vocab=0, _shapes=head.head_weight_shapes):
    out = _shapes(arch, variant, with_layer, draft_vocab)
    return out | ({NEW + k[6:]: v for k, v in out.items() if k.startswith("layer.")} if with_layer else {})


def block(weights, arch, linear, _layer=head._llama_layer):
    first = head.LlamaBlock(arch, _layer(weights, arch, linear))
    second = head.LlamaBlock(arch, _layer({"layer." + k[len(NEW) :]: v for k, v in weights.items() if k.startswith(NEW)}, arch, linear))
    return lambda x, cos, sin, attend: second(first(x, cos, sin, attend), cos, sin, attend)


def trained_start(start, fresh, kind, _start=trainer.trained_start):
    if any(k.startswith(NEW) for k in start.weights):
        return _start(start, fresh, kind)
    out = _start(start, {k: v for k, v in fresh.items() if not k.startswith(NEW)}, kind)
    for k, v in list(out.items()):
        if k.startswith("layer."):
            zero = k.endswith(("o_proj.weight", "down_proj.weight"))
            out[NEW + k[6:]] = v.clone().zero_() if zero else v.clone()
    return out


def attend(self, batch, step, history, _attend=objective.HeadObjective._attend):
    """Each layer attends over its own keys of the unrolled steps (the list `history` is the
    forward's; each layer keeps its own beside it), the two layers called in turn."""
    if getattr(self, "_histories", (None,))[0] is not history:
        self._histories = (history, [[], []])
    layers = [_attend(self, batch, step, h) for h in self._histories[1]]
    calls = iter(range(1 << 30))
    return lambda q, k, v: layers[next(calls) % 2](q, k, v)


head.head_weight_shapes, head._block = shapes, block
trainer.trained_start, objective.HeadObjective._attend = trained_start, attend

if __name__ == "__main__":
    if sys.argv[1:2] == ["agreement"]:
        from speculant.training.agreement import main as agreement

        sys.exit(agreement(sys.argv[2:]))
    from speculant.cli import main

    sys.exit(main(sys.argv[1:]))
