import gc
import pathlib

import pytest
import torch
from testkit import resident_bytes

from speculant.kv_cache.cache import CacheLayout, KVCache, zeroed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zeroed_is_an_aligned_writable_zero_tensor(dtype):
    t = zeroed((3, 5, 2, 8), dtype, torch.device("cpu"))
    assert t.shape == (3, 5, 2, 8) and t.dtype == dtype and t.is_contiguous()
    assert t.data_ptr() % 64 == 0
    assert not t.any()
    t[1, 2] = 1.5
    assert t.sum().item() == 1.5 * 16


@pytest.fixture
def no_gc():
    """RSS deltas count only this test's memory: earlier tests' garbage is freed first, and no
    collection frees more of it mid-measurement (one did in CI: 32 MiB written, +4 KiB seen)."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


@pytest.mark.skipif(not pathlib.Path("/proc/self/statm").exists(), reason="reads Linux's /proc")
def test_a_cpu_kv_cache_takes_memory_only_where_it_is_written(no_gc):
    layout = CacheLayout(num_layers=4, kv_heads=2, k_dim=128, v_dim=128)
    before = resident_bytes()
    cache = KVCache(layout, num_pages=8192, page_size=16, dtype=torch.float32, device=torch.device("cpu"))  # 1 GiB of K and V
    assert cache.k.numel() * 4 + cache.v.numel() * 4 == 1 << 30
    assert resident_bytes() - before < 64 << 20
    cache.k[:, :8192] = 1.0  # 512 pages of K, 4 layers: 32 MiB
    grown = resident_bytes() - before
    assert 32 << 20 <= grown < 96 << 20
    assert not cache.v.any()


@pytest.mark.parametrize("values_in_keys", [True, False], ids=["mla", "k_and_v"])
def test_move_reads_every_source_before_writing_and_copies_each_storage_once(values_in_keys):
    """Overlapping moves, as tree compaction makes them (slot 2's row to slot 1 while slot 2
    takes slot 5's): the result is the gather of the old rows, for K and for V, also where V is
    a view of K's first columns (MLA's latent)."""
    layout = CacheLayout(num_layers=2, kv_heads=1 if values_in_keys else 2, k_dim=12, v_dim=8, values_in_keys=values_in_keys)
    cache = KVCache(layout, num_pages=4, page_size=4, dtype=torch.float32, device=torch.device("cpu"))
    cache.k.copy_(torch.randn(cache.k.shape))
    if not values_in_keys:
        cache.v.copy_(torch.randn(cache.v.shape))
    src, dst = torch.tensor([2, 5, 3, 9, 4]), torch.tensor([1, 2, 3, 5, 9])
    expected_k, expected_v = cache.k.clone(), cache.v.clone()
    expected_k[:, dst], expected_v[:, dst] = cache.k[:, src], cache.v[:, src]
    cache.move(src, dst)
    torch.testing.assert_close(cache.k, expected_k, rtol=0, atol=0)
    torch.testing.assert_close(cache.v, expected_v, rtol=0, atol=0)
    if values_in_keys:
        assert cache.v.data_ptr() == cache.k.data_ptr()  # still the view
