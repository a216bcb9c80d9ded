from speculant.kv_cache.allocator import OutOfPages, PageAllocator, PageTables

__all__ = ["OutOfPages", "PageAllocator", "PageTables"]
