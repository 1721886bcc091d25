"""RoutingRecorder: preallocated, routed-only, saved and loaded with safetensors."""

import pytest
import torch

from moegate import RouterConfig, RoutingRecorder, route


@pytest.mark.parametrize("dtype", [torch.int16, torch.int32])
def test_save_load_round_trip(tmp_path, dtype):
    cfg = RouterConfig(num_experts=64, top_k=4, num_shared_experts=1)
    rec = RoutingRecorder(num_layers=2, max_tokens=8, top_k=4, num_experts=64, dtype=dtype)
    buffer = rec.ids
    for layer in range(2):
        route(torch.randn(6, 64), cfg, recorder=rec, layer=layer, num_valid_tokens=5, backend="reference")
    assert rec.ids is buffer  # recording never reallocates
    path = tmp_path / "capture.safetensors"
    rec.save(path)
    back = RoutingRecorder.load(path)
    assert back.ids.dtype == dtype and torch.equal(back.ids, rec.ids)
    assert back.num_tokens.tolist() == [6, 6] and back.num_experts == 64 and back.top_k == 4
    assert (back.layer_ids(0)[5] == -1).all() and (back.layer_ids(0)[:5] >= 0).all()


def test_load_rejects_files_that_are_not_captures(tmp_path):
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00\x01 not a safetensors file")
    with pytest.raises(ValueError, match="not a readable safetensors"):
        RoutingRecorder.load(junk)
    from safetensors.torch import save_file

    no_meta = tmp_path / "no_meta.safetensors"
    save_file({"ids": torch.zeros(1, 2, 2, dtype=torch.int32), "num_tokens": torch.zeros(1, dtype=torch.int64)},
              str(no_meta), {"format": "moegate.routing/1"})
    with pytest.raises(ValueError, match="num_experts"):
        RoutingRecorder.load(no_meta)
    other = tmp_path / "other.safetensors"
    save_file({"weights": torch.zeros(2)}, str(other))
    with pytest.raises(ValueError, match="not a moegate routing capture"):
        RoutingRecorder.load(other)


def test_recorder_arguments_are_checked():
    with pytest.raises(TypeError, match="dtype"):
        RoutingRecorder(1, 4, 2, 8, dtype=torch.int64)
    with pytest.raises(ValueError, match="int16"):
        RoutingRecorder(1, 4, 2, 40000, dtype=torch.int16)
    with pytest.raises(ValueError, match="num_layers"):
        RoutingRecorder(0, 4, 2, 8)
