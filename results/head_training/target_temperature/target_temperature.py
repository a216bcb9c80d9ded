"""An experiment, not an option: train a head against the target's distribution sharpened to
p^(1/T) (renormalized over the stored top-K and the draft vocabulary), T < 1 leaning toward the
target's top token, which is all that greedy acceptance scores. Patched into the training code
in-process: the loss's gradient is the sharpened cross-entropy's, its value (and so every logged
CE, KL and held-out measure) the temperature-1 one, so the curves compare across T.

    python target_temperature.py T train-head ...   (speculant's command, that loss)
"""

import sys

import speculant  # noqa: F401  (before torch)
import speculant.training.objective as objective

_soft_ce = objective.HeadObjective._soft_ce


def sharpened(temperature: float):
    def soft_ce(self, modules, out, label_ids, label_logprobs):
        ce, entropy, correct = _soft_ce(self, modules, out, label_ids, label_logprobs)
        sharp, _, _ = _soft_ce(self, modules, out, label_ids, label_logprobs / temperature)
        return sharp + (ce - sharp).detach(), entropy, correct  # the value of ce, the gradient of sharp

    return soft_ce


if __name__ == "__main__":
    objective.HeadObjective._soft_ce = sharpened(float(sys.argv[1]))
    from speculant.cli import main

    sys.exit(main(sys.argv[2:]))
