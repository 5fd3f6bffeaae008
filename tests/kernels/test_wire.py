import pytest
import torch

from a2a_tune.kernels._wire import mask_nonlocal, pack_meta, unpack_meta


@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("topk", [1, 3, 8])
def test_meta_round_trips_exactly(ids_dtype, topk):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 1000, (5, topk), generator=g).to(ids_dtype)
    w = torch.rand(5, topk, generator=g)
    meta = pack_meta(ids, w)
    assert meta.dtype == torch.int32 and meta.shape == (5, 2 * topk)
    ids2, w2 = unpack_meta(meta, topk)
    assert ids2.dtype == torch.int64 and torch.equal(ids2, ids.to(torch.int64))
    assert w2.dtype == torch.float32 and torch.equal(w2, w)  # bit-exact: weights are bit-cast, not converted


def test_meta_of_zero_tokens_is_empty():
    meta = pack_meta(torch.empty(0, 2, dtype=torch.int64), torch.empty(0, 2))
    assert meta.shape == (0, 4)
    ids, w = unpack_meta(meta, 2)
    assert ids.shape == (0, 2) and w.shape == (0, 2)


def test_mask_nonlocal_keeps_only_the_rank_range():
    ids = torch.tensor([[0, 3, 4, 7], [8, 2, 5, 1]])
    assert mask_nonlocal(ids, 2, 6).tolist() == [[-1, 3, 4, -1], [-1, 2, 5, -1]]
