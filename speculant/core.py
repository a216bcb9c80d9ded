"""The nouns of the data path: Request, Batch, DraftProposal, StepOutput, StepResult, RequestOutput."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from speculant.sampling.params import SamplingParams
from speculant.sampling.rng import PositionNoise


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"  # EOS, stop token or stop string
    FINISHED_LENGTH = "length"  # max_tokens or the model's context
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"

    @property
    def finished(self) -> bool:
        return self not in (RequestStatus.WAITING, RequestStatus.RUNNING)


@dataclass
class SpecStats:
    """Speculation counters of one request (or, summed, of the engine)."""

    target_forwards: int = 0  # target forwards that emitted tokens for this request
    emitted_tokens: int = 0  # tokens emitted by those forwards (bonus included)
    draft_steps: int = 0  # speculative steps (one proposal verified)
    draft_tokens: int = 0  # tokens proposed
    accepted_tokens: int = 0  # proposed tokens the target accepted
    accepted_by_position: list[int] = field(default_factory=list)  # [k_max] accepted at draft slot i
    proposed_by_position: list[int] = field(default_factory=list)  # [k_max] proposed at draft slot i

    def record(self, num_proposed: int, num_accepted: int) -> None:
        self.draft_steps += 1
        self.draft_tokens += num_proposed
        self.accepted_tokens += num_accepted
        count_by_position(self.proposed_by_position, self.accepted_by_position, num_proposed, num_accepted)

    def merge(self, other: SpecStats) -> None:
        self.target_forwards += other.target_forwards
        self.emitted_tokens += other.emitted_tokens
        self.draft_steps += other.draft_steps
        self.draft_tokens += other.draft_tokens
        self.accepted_tokens += other.accepted_tokens
        n = max(len(self.proposed_by_position), len(other.proposed_by_position))
        for name in ("proposed_by_position", "accepted_by_position"):
            mine, theirs = getattr(self, name), getattr(other, name)
            setattr(self, name, [_at(mine, i) + _at(theirs, i) for i in range(n)])

    @property
    def tau(self) -> float:
        """Mean tokens emitted per verifying target forward, bonus included (accepted drafts past
        a stop or max_tokens not counted); 1.0 without speculation."""
        if self.draft_steps == 0:
            return 1.0 if self.target_forwards else 0.0
        return 1.0 + self.accepted_tokens / self.draft_steps

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / p if p else 0.0 for a, p in zip(self.accepted_by_position, self.proposed_by_position)]


def count_by_position(reached: list, accepted: list, num_reached: int, num_accepted: int) -> None:
    """Add one verify outcome to per-slot counts in place: slots 0..num_reached-1 were reached,
    the first num_accepted of them accepted; the lists grow to cover every reached slot."""
    grow = num_reached - len(reached)
    if grow > 0:
        reached += [0] * grow
        accepted += [0] * grow
    for i in range(num_reached):
        reached[i] += 1
        accepted[i] += int(i < num_accepted)


def _at(values: list[int], i: int) -> int:
    return values[i] if i < len(values) else 0


@dataclass(eq=False)  # identity: requests are compared and looked up as objects
class Request:
    """One generation request; its tokens are prompt + output, its KV length `num_computed_tokens`.

    Invariant between steps: the target's KV holds every token but the last one, which is the
    input of the next step (`num_computed_tokens == num_tokens - 1` once decoding).
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    stop_token_ids: frozenset[int] = frozenset()
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    noise: PositionNoise | None = None  # a seeded request's position-keyed randomness
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finish_time: float | None = None
    num_preemptions: int = 0
    error: str | None = None
    spec_stats: SpecStats = field(default_factory=SpecStats)
    user: str | None = None  # who sent it (scopes cross-request speculation state); None: anonymous

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) without concatenating prompt and output (decode reads one)."""
        n = len(self.prompt_token_ids)
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        return self.prompt_token_ids[start:end] + self.output_token_ids[: max(0, end - n)]

    def token_at(self, position: int) -> int:
        n = len(self.prompt_token_ids)
        return self.prompt_token_ids[position] if position < n else self.output_token_ids[position - n]

    @property
    def is_prefill(self) -> bool:
        """True until the first sample after (re)admission: the KV lacks more than the last token."""
        return self.num_computed_tokens == 0 or self.num_computed_tokens < self.num_tokens - 1

    @property
    def finished(self) -> bool:
        return self.status.finished


@dataclass
class ScheduledSeq:
    """One sequence's share of a step: compute tokens [num_computed, num_computed + num_new)."""

    request: Request
    num_new_tokens: int

    @property
    def samples(self) -> bool:
        """Whether this chunk reaches the end of the known tokens, so the step samples a token."""
        return self.request.num_computed_tokens + self.num_new_tokens == self.request.num_tokens


@dataclass
class Batch:
    """What the scheduler hands the engine for one step."""

    seqs: list[ScheduledSeq]

    @property
    def is_decode(self) -> bool:
        return bool(self.seqs) and all(not s.request.is_prefill for s in self.seqs)

    @property
    def requests(self) -> list[Request]:
        return [s.request for s in self.seqs]

    def __len__(self) -> int:
        return len(self.seqs)


@dataclass
class DraftTree:
    """One draft tree per sequence (EAGLE-style): `DraftProposal.token_ids[b, :num_drafts[b]]`
    are its nodes in breadth-first order, `draft_probs[b, i]` the law node i was drawn from.
    Built and read by `speculant.speculative.tree`."""

    parents: list[list[int]]  # [B][num_drafts[b]] parent node index, -1 under the last verified token


@dataclass
class DraftProposal:
    """What a proposer returns: k_i draft tokens per sequence of a decode batch (padded with -1)."""

    token_ids: torch.Tensor  # [B, k_max] int64, -1 past num_drafts[b]
    num_drafts: list[int]  # [B] k_i
    draft_probs: torch.Tensor | None = None  # [B, k_max, V] q(d); None means one-hot at token_ids
    tree: DraftTree | None = None  # set by tree proposers; None for chains


@dataclass
class StepOutput:
    """Tokens a step emitted for each sequence (accepted drafts + recovered/bonus, or one sample)."""

    token_ids: list[list[int]]  # [B][n_b]
    logprobs: list[list[float]] | None = None  # [B][n_b] when any request asked for them
    top_logprobs: list[list[list[tuple[int, float]]]] | None = None  # [B][n_b][n] (id, logprob)
    proposed: list[int] | None = None  # [B] drafts each sequence verified (a tree: its depth); None on plain steps


@dataclass(frozen=True)
class StepResult:
    """What a step did, handed to the proposer after its tokens are committed to the requests.

    Sequence b of the batch owns rows [row_offsets[b], row_offsets[b + 1]) of the step's flat
    target forward: its prefill chunk or sampled input on a plain step, its last token and k_b
    drafts on a speculative step (row row_offsets[b] + i verified draft i; the accepted ones are
    the first num_accepted[b]).
    """

    requests: list[Request]  # [B] the batch's requests, finished ones included
    row_offsets: list[int]  # [B + 1] each sequence's rows of the flat forward; row_offsets[-1] == T
    kv_starts: list[int]  # [B] position (KV slot) of each sequence's first row
    hidden_states: torch.Tensor  # [T, hidden] the target's last-layer states (device), before the final norm;
    # [T, 3 * hidden] its feature layers' outputs when an eagle3 head reads them (`Executor.expose_features`)
    num_accepted: torch.Tensor  # [B] int64 (device) drafts the target accepted; 0 on plain steps
    bonus_token_ids: torch.Tensor  # [B] int64 (device) the target's own token after the accepted drafts
    # (recovered, bonus, or the plain sample); -1 where the step sampled nothing (a prefill chunk)
    emitted_token_ids: list[list[int]] | None  # [B][n_b] tokens appended to each request (after max_tokens
    # and stop cuts); None in `Proposer.launch`, before the host has read them
    speculative: bool  # drafts were verified (else a plain forward and sample)
    accepted_rows: torch.Tensor | None = None  # [B, D + 1] int64 (device) on a tree step: the flat rows of each
    # sequence's last verified token and its accepted path (row j for j <= num_accepted[b]), root row after
    accepted_counts: list[int] | None = None  # [B] num_accepted as the host read it; None before the read
    accepted_paths: list[list[int]] | None = None  # [B][num_accepted[b]] a tree step's accepted nodes, root to tip, as read


@dataclass
class CompletionStats:
    ttft_s: float
    inter_token_latency_s: float
    tokens_per_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    num_preemptions: int
    tau: float
    acceptance_rate: float
    draft_tokens: int
    accepted_tokens: int


@dataclass
class RequestOutput:
    """What the engine reports for a request after a step (and, finished, what generate returns)."""

    request_id: str
    text: str
    token_ids: list[int]  # generated tokens only
    new_token_ids: list[int]  # tokens emitted by this step
    new_text: str  # text added by this step
    finished: bool
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None  # per token: (id, logprob), best first
    num_prompt_tokens: int = 0
    stats: CompletionStats | None = None
    error: str | None = None
