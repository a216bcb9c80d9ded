"""The head's training loss over a flat batch: the head (`speculant.models.head`, the code the
proposer runs) with trainable weights, the target's embedding and lm_head frozen beside it.

Loss per trained entry = soft cross-entropy of the head's logits against the target's top-K
distribution (renormalized over the kept draft vocabulary) + `hidden_weight` * smooth-L1 of the
head's output to h_{i+1}, summed over unroll steps and divided by the global batch's entry count.
An eagle3 head reads the target's feature layers [T, 3H] at step 1 (fused by the head's fc, by
width) and its own outputs [T, H] after; it has no regression term, and its own lm_head (a
trained weight, `lm_head.weight`) scores the draft vocabulary.

Attention of unroll step s (the draft chain, as at inference): entry j attends to step-1 entries
of its sequence at positions <= j - s + 1 (what the target's hidden states filled) and to the one
entry of each later step r <= s on its chain, at position j - s + r. Sequences are packed, so the
mask is block-diagonal; K/V heads are shared by groups of query heads (GQA).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from speculant.config import ArchConfig
from speculant.layers.rotary import RotaryEmbedding
from speculant.models.head import build_modules, head_arch, head_forward, head_logits
from speculant.training.batches import Batch

ATTENTION_BLOCK = 512  # rows per attention call: whole sequences, so a block's mask stays exact


def _param_name(name: str) -> str:
    return name.replace(".", "__")  # module attribute names may not hold dots


class HeadObjective(nn.Module):
    def __init__(
        self,
        arch: ArchConfig,
        variant: str,
        weights: dict[str, torch.Tensor],  # init_head_weights names
        embed: torch.Tensor,  # [vocab, H] the target's, frozen
        lm_head: torch.Tensor,  # [vocab, H] the target's, frozen
        vocab_map: torch.Tensor | None,  # [Nk] int64 sorted target ids, None = full vocabulary
        unroll: int = 1,
        hidden_weight: float = 0.0,
    ) -> None:
        super().__init__()
        self.arch, self.variant, self.unroll, self.hidden_weight = head_arch(arch), variant, unroll, hidden_weight
        self.rotary = RotaryEmbedding(self.arch, embed.device, torch.float32)
        self.names = list(weights)
        for name, w in weights.items():
            self.register_parameter(_param_name(name), nn.Parameter(w.detach().clone().float()))
        # Frozen shared tensors: plain attributes, not parameters or buffers, so they are never
        # trained, synchronized or saved with the head.
        self.embed, self.lm_head, self.vocab_map = embed.detach(), lm_head.detach(), vocab_map
        self.draft_index = _draft_index(vocab_map, lm_head.shape[0])
        self.attention_block = ATTENTION_BLOCK

    def freeze(self, name: str) -> None:
        """Keep the head tensor `name` at its starting value (no gradient, so AdamW skips it)."""
        getattr(self, _param_name(name)).requires_grad_(False)

    def head_weights(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, _param_name(name)) for name in self.names}

    def forward(self, batch: Batch, num_global: int, world: int = 1) -> tuple[torch.Tensor, dict[str, float]]:
        """(loss to backpropagate, metrics summed over this rank's entries). `num_global`: trained
        entries of the whole global batch, all steps; `world`: DDP averages gradients over ranks,
        so each rank's sum is scaled by world / num_global."""
        weights = self.head_weights()
        total = sum(p.sum() * 0.0 for p in weights.values())  # every parameter joins the graph
        modules = build_modules(weights, self.arch, self.variant)
        metrics: dict[str, float] = {}
        if batch.num_entries == 0:
            return total, metrics
        embeds = F.embedding(batch.embed_ids, self.embed)  # [T, H]
        cos, sin = self.rotary.lookup(batch.local)
        hidden, history = batch.hidden_in, []
        for step in range(1, self.unroll + 1):
            attend = self._attend(batch, step, history)
            out = head_forward(self.arch, modules, embeds, hidden, cos, sin, attend)  # [T, H]
            rows = batch.step_mask(step).nonzero().squeeze(1)
            ce, entropy, correct = self._soft_ce(modules, out[rows], batch.label_ids[rows], batch.label_logprobs[rows])
            reg = _regression(out[rows], batch.hidden_next[rows])  # [n]
            total = total + ce.sum() + self.hidden_weight * reg.sum()
            metrics[f"ce_{step}"] = float(ce.detach().sum())
            metrics[f"kl_{step}"] = float((ce.detach() - entropy).sum())
            metrics[f"reg_{step}"] = float(reg.detach().sum())
            metrics[f"acc_{step}"] = float(correct.sum())
            metrics[f"n_{step}"] = float(rows.numel())
            hidden = _shift_within_sequences(out, batch.seq_ids)
        return total * (world / max(num_global, 1)), metrics

    @torch.no_grad()
    def logits_of(self, batch: Batch) -> torch.Tensor:  # [T, Nk] step-1 logits of every entry
        modules = build_modules(self.head_weights(), self.arch, self.variant)
        embeds = F.embedding(batch.embed_ids, self.embed)
        cos, sin = self.rotary.lookup(batch.local)
        out = head_forward(self.arch, modules, embeds, batch.hidden_in, cos, sin, self._attend(batch, 1, []))
        return head_logits(self.arch, modules, out, self.lm_head, self.vocab_map)

    def _soft_ce(self, modules, out, label_ids, label_logprobs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per row: -sum_k p_k log q(id_k), p the target's top-K renormalized over the draft
        vocabulary; p's entropy (so ce - entropy is KL(p || q)); whether the head's top token is
        the target's top token."""
        logits = head_logits(self.arch, modules, out, self.lm_head, self.vocab_map)  # [n, Nk]
        logq = torch.log_softmax(logits.float(), dim=-1)
        index = self.draft_index[label_ids]  # [n, K], -1 outside the draft vocabulary
        p = torch.softmax(label_logprobs, dim=-1) * (index >= 0)
        p = p / p.sum(-1, keepdim=True).clamp_min(1e-12)
        ce = -(p * logq.gather(1, index.clamp_min(0))).sum(-1)  # [n]
        entropy = -(p * p.clamp_min(1e-12).log()).sum(-1)  # [n]
        top = index[:, 0]  # the target's most likely token, in draft indices
        return ce, entropy.detach(), logq.argmax(-1) == top

    def _attend(self, batch: Batch, step: int, history: list) -> Callable:
        """Attention of unroll step `step` over the packed batch, in blocks of whole sequences
        (a block-diagonal mask wastes the rest of a T x T product)."""
        ranges = _blocks(batch.seq_ids, self.attention_block)
        blocks = [(lo, hi, _chain_mask(batch.seq_ids[lo:hi], batch.local[lo:hi], step)) for lo, hi in ranges]

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            # q [T, heads, hd], k/v [T, kv_heads, hd] -> [T, heads * hd]
            history.append((k, v))
            outs = []
            for lo, hi, mask in blocks:  # mask [n, step * n]
                keys = torch.cat([kk[lo:hi] for kk, _ in history]).transpose(0, 1)  # [kv_heads, step * n, hd]
                values = torch.cat([vv[lo:hi] for _, vv in history]).transpose(0, 1)
                o = F.scaled_dot_product_attention(q[lo:hi].transpose(0, 1), keys, values, attn_mask=mask, enable_gqa=True)
                outs.append(o.transpose(0, 1).reshape(hi - lo, -1))
            return torch.cat(outs)

        return attend


def _regression(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:  # [n, H], [n, H] or [n, 0] -> [n]
    """Smooth-L1 of each output row to its target; zeros where the batch has no targets (eagle3)."""
    if target.shape[-1] == 0:
        return out.new_zeros(out.shape[0])
    return F.smooth_l1_loss(out, target, reduction="none").mean(-1)


def _blocks(seq_ids: torch.Tensor, target: int) -> list[tuple[int, int]]:
    """[lo, hi) row ranges of consecutive whole sequences, about `target` rows each."""
    starts = torch.nonzero(torch.diff(seq_ids, prepend=seq_ids[:1] - 1)).squeeze(1).tolist() + [seq_ids.numel()]
    out, lo = [], 0
    for start in starts[1:]:
        if start - lo >= target or start == seq_ids.numel():
            out.append((lo, start))
            lo = start
    return out


def _chain_mask(seq_ids: torch.Tensor, local: torch.Tensor, step: int) -> torch.Tensor:  # [T, step*T] bool
    same = seq_ids[:, None] == seq_ids[None, :]  # [T, T]
    j, p = local[:, None], local[None, :]
    blocks = [same & (p <= j - step + 1)]
    blocks += [same & (p == j - step + r) for r in range(2, step + 1)]
    return torch.cat(blocks, dim=1)


def _shift_within_sequences(out: torch.Tensor, seq_ids: torch.Tensor) -> torch.Tensor:
    """Row j gets out[j - 1] when that row is the same sequence's previous entry, else zeros."""
    shifted = torch.cat([out.new_zeros(1, out.shape[1]), out[:-1]])
    same = torch.cat([seq_ids.new_zeros(1, dtype=torch.bool), seq_ids[1:] == seq_ids[:-1]])
    return shifted * same[:, None]


def _draft_index(vocab_map: torch.Tensor | None, vocab_size: int) -> torch.Tensor:  # [vocab] int64
    if vocab_map is None:
        return torch.arange(vocab_size)
    index = torch.full((vocab_size,), -1, dtype=torch.int64)
    index[vocab_map] = torch.arange(vocab_map.numel())
    return index
