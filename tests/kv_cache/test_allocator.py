"""PageAllocator and PageTables under random operation sequences: no page leaks, none is owned
twice, a refused `ensure` allocates nothing, and freeing a page one does not own raises."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from speculant.kv_cache.allocator import OutOfPages, PageAllocator, PageTables

SEQS = st.sampled_from([f"seq-{i}" for i in range(6)])


class AllocatorMachine(RuleBasedStateMachine):
    """Tables driven the way the scheduler drives them, plus raw allocations held by the test."""

    @initialize(num_pages=st.integers(1, 24), page_size=st.integers(1, 5))
    def setup(self, num_pages: int, page_size: int) -> None:
        self.allocator = PageAllocator(num_pages)
        self.tables = PageTables(self.allocator, page_size)
        self.held: list[int] = []  # pages the test allocated directly
        self.seen: set[str] = set()

    @rule(seq=SEQS, num_slots=st.integers(0, 60))
    def ensure(self, seq: str, num_slots: int) -> None:
        before, free_before = list(self.tables.table(seq)), self.allocator.num_free
        extra = self.tables.extra_pages(seq, num_slots)
        ok = self.tables.ensure(seq, num_slots)
        self.seen.add(seq)
        table = self.tables.table(seq)
        assert ok == (extra <= free_before)
        if ok:
            assert table[: len(before)] == before  # growth only appends
            assert len(table) == max(len(before), self.tables.pages_for(num_slots))
            assert self.allocator.num_free == free_before - extra
        else:
            assert table == before and self.allocator.num_free == free_before

    @rule(seq=SEQS, num_slots=st.integers(0, 60))
    def shrink(self, seq: str, num_slots: int) -> None:
        before = list(self.tables.table(seq))
        self.tables.shrink(seq, num_slots)
        keep = min(len(before), self.tables.pages_for(num_slots))
        assert self.tables.table(seq) == before[:keep]

    @rule(seq=SEQS)
    def release(self, seq: str) -> None:
        n, free_before = len(self.tables.table(seq)), self.allocator.num_free
        self.tables.release(seq)
        assert seq not in self.tables and self.tables.table(seq) == []
        assert self.allocator.num_free == free_before + n

    @precondition(lambda self: self.tables.num_seqs > 0)
    @rule(data=st.data())
    def preempt_largest(self, data) -> None:
        """Preemption by recompute: every page of one sequence goes back, then it re-grows."""
        seqs = sorted(self.seen, key=lambda s: -len(self.tables.table(s)))
        victim = seqs[0]
        self.release(victim)
        self.ensure(victim, data.draw(st.integers(0, 20), label="recompute_slots"))

    @rule(n=st.integers(0, 6))
    def allocate_raw(self, n: int) -> None:
        free_before = self.allocator.num_free
        if n > free_before:
            with pytest.raises(OutOfPages):
                self.allocator.allocate(n)
            assert self.allocator.num_free == free_before
            return
        pages = self.allocator.allocate(n)
        assert len(set(pages)) == n and not set(pages) & set(self.held)
        self.held += pages

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def free_raw(self, data) -> None:
        pages = data.draw(
            st.lists(st.sampled_from(self.held), unique=True, min_size=1), label="pages"
        )
        self.allocator.free(pages)
        self.held = [p for p in self.held if p not in pages]

    @rule(data=st.data())
    def free_unowned_raises(self, data) -> None:
        """Freeing a page that is free (or out of range), alone or after owned ones, raises and
        frees nothing."""
        owned = self.held[:1]
        unowned = data.draw(st.integers(-2, self.allocator.num_pages + 2), label="page")
        if unowned in self._owned_pages():
            return
        free_before, used_before = self.allocator.num_free, self.allocator.num_used
        with pytest.raises(ValueError, match="not allocated"):
            self.allocator.free(owned + [unowned])
        assert (self.allocator.num_free, self.allocator.num_used) == (free_before, used_before)

    @precondition(lambda self: self.held)
    @rule()
    def double_free_raises(self) -> None:
        page = self.held[-1]
        free_before = self.allocator.num_free
        with pytest.raises(ValueError, match="not allocated"):
            self.allocator.free([page, page])
        assert self.allocator.num_free == free_before

    def _owned_pages(self) -> list[int]:
        return [p for s in self.seen for p in self.tables.table(s)] + self.held

    @invariant()
    def pages_are_conserved_and_singly_owned(self) -> None:
        owned = self._owned_pages()
        assert len(owned) == len(set(owned)), "a page is in two tables"
        assert self.allocator.num_free + len(owned) == self.allocator.num_pages, "a page leaked"
        assert self.allocator.num_used == len(owned)
        # Drain the free list through the public API: it must hold exactly the unowned pages.
        free = self.allocator.allocate(self.allocator.num_free)
        assert len(free) == len(set(free)), "a page is free twice"
        assert sorted(free + owned) == list(range(self.allocator.num_pages)), (
            "a page is free and owned"
        )
        self.allocator.free(free)


AllocatorMachine.TestCase.settings = settings(
    max_examples=120, stateful_step_count=40, deadline=None
)
TestAllocatorMachine = AllocatorMachine.TestCase


def test_low_ids_first_and_out_of_pages() -> None:
    allocator = PageAllocator(4)
    assert allocator.allocate(2) == [0, 1]
    with pytest.raises(OutOfPages):
        allocator.allocate(3)
    assert allocator.num_free == 2


def test_rejects_empty_allocator() -> None:
    with pytest.raises(ValueError, match="num_pages"):
        PageAllocator(0)


def test_ensure_refused_allocates_nothing() -> None:
    tables = PageTables(PageAllocator(3), page_size=4)
    assert tables.ensure("a", 8)  # 2 pages
    assert not tables.ensure("b", 9)  # needs 3, 1 free
    assert "b" not in tables and tables.allocator.num_free == 1
    assert not tables.ensure("a", 13)  # needs 2 more
    assert tables.table("a") == [0, 1]
