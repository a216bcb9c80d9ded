"""Page allocation in plain Python over integers (no torch).

One `PageAllocator` per engine serves every model the engine runs: a sequence's page table is
valid for the target and for any draft, each model owning its own K/V tensors indexed by the same
page ids. Slot `s` of a sequence lives in page `table[s // page_size]` at offset `s % page_size`.
"""

from __future__ import annotations


class OutOfPages(RuntimeError):
    """Raised when an allocation asks for more pages than are free."""


class PageAllocator:
    def __init__(self, num_pages: int) -> None:
        if num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {num_pages}")
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, -1, -1))  # a stack: pop() hands out low ids first
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._used)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfPages(f"asked for {n} pages, {len(self._free)} free")
        pages = [self._free.pop() for _ in range(n)]
        self._used.update(pages)
        return pages

    def free(self, pages: list[int]) -> None:
        """Return `pages`; all or nothing, so a bad id (or one listed twice) frees no page."""
        seen: set[int] = set()
        for page in pages:
            if page not in self._used or page in seen:
                raise ValueError(f"page {page} is not allocated")
            seen.add(page)
        self._used.difference_update(pages)
        self._free.extend(pages)


class PageTables:
    """Per-sequence page tables over one allocator."""

    def __init__(self, allocator: PageAllocator, page_size: int) -> None:
        self.allocator = allocator
        self.page_size = page_size
        self._tables: dict[str, list[int]] = {}

    def table(self, seq_id: str) -> list[int]:
        return self._tables.get(seq_id, [])

    def pages_for(self, num_slots: int) -> int:
        return -(-num_slots // self.page_size)

    def extra_pages(self, seq_id: str, num_slots: int) -> int:
        """Pages that `ensure(seq_id, num_slots)` would allocate."""
        return max(0, self.pages_for(num_slots) - len(self.table(seq_id)))

    def ensure(self, seq_id: str, num_slots: int) -> bool:
        """Grow the table to cover `num_slots` slots; allocate nothing and return False if short."""
        extra = self.extra_pages(seq_id, num_slots)
        if extra > self.allocator.num_free:
            return False
        if extra:
            self._tables.setdefault(seq_id, []).extend(self.allocator.allocate(extra))
        return True

    def shrink(self, seq_id: str, num_slots: int) -> None:
        """Release the pages past those that hold the first `num_slots` slots."""
        table = self._tables.get(seq_id)
        keep = self.pages_for(num_slots)
        if table and len(table) > keep:
            self.allocator.free(table[keep:])
            del table[keep:]

    def release(self, seq_id: str) -> None:
        table = self._tables.pop(seq_id, None)
        if table:
            self.allocator.free(table)

    def __contains__(self, seq_id: str) -> bool:
        return seq_id in self._tables

    @property
    def num_seqs(self) -> int:
        return len(self._tables)
