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
    tagged = tmp_path / "tagged.safetensors"  # the format tag but no ids (a review: a bare KeyError was possible)
    save_file({"num_tokens": torch.zeros(1, dtype=torch.int64)}, str(tagged), {"format": "moegate.routing/1"})
    with pytest.raises(ValueError, match="not a moegate routing capture"):
        RoutingRecorder.load(tagged)


def test_recorder_arguments_are_checked():
    with pytest.raises(TypeError, match="dtype"):
        RoutingRecorder(1, 4, 2, 8, dtype=torch.int64)
    with pytest.raises(ValueError, match="int16"):
        RoutingRecorder(1, 4, 2, 40000, dtype=torch.int16)
    with pytest.raises(ValueError, match="num_layers"):
        RoutingRecorder(0, 4, 2, 8)


def _capture_file(path, ids, num_tokens, **meta):
    from safetensors.torch import save_file

    save_file({"ids": ids, "num_tokens": torch.tensor(num_tokens)}, str(path),
              {"format": "moegate.routing/1", **{k: str(v) for k, v in meta.items()}})
    return path


def test_load_checks_what_the_file_claims(tmp_path):
    """A loaded capture is held to what the constructor and record() hold a new one to: int16 ids never wrap (a file
    may pair int16 with 40000 experts), num_tokens within [-1, max_tokens], top_k the ids' width."""
    wide = RoutingRecorder.load(_capture_file(tmp_path / "wide.safetensors", torch.full((1, 2, 1), -1,
                                                                                          dtype=torch.int16),
                                              [-1], num_experts=40000, top_k=1))
    x = torch.full((1, 40000), -5.0)
    x[0, 39999] = 5.0
    with pytest.raises(ValueError, match="cannot hold id 39999"):
        route(x, RouterConfig(num_experts=40000, top_k=1), recorder=wide, backend="reference")
    with pytest.raises(ValueError, match="cannot hold id 35000"):  # record() too (a review, 2026-12-06: it wrapped)
        wide.record(0, torch.tensor([[35000], [1]]))
    assert (wide.ids == -1).all()
    ids = torch.zeros(1, 2, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match="num_tokens=5, outside"):
        RoutingRecorder.load(_capture_file(tmp_path / "long.safetensors", ids, [5], num_experts=8, top_k=3))
    with pytest.raises(ValueError, match="top_k='2', but the ids are 3 wide"):
        RoutingRecorder.load(_capture_file(tmp_path / "k.safetensors", ids, [2], num_experts=8, top_k=2))
    with pytest.raises(ValueError, match="num_experts=0"):
        RoutingRecorder.load(_capture_file(tmp_path / "e.safetensors", ids, [2], num_experts=0, top_k=3))


def test_save_writes_no_stale_rows(tmp_path):
    """After a batch of 6 and then one of 3, the buffer still holds rows 3-5 of the first: the file has -1 there."""
    cfg = RouterConfig(num_experts=16, top_k=2)
    rec = RoutingRecorder(num_layers=1, max_tokens=8, top_k=2, num_experts=16)
    route(torch.randn(6, 16), cfg, recorder=rec, backend="reference")
    route(torch.randn(3, 16), cfg, recorder=rec, backend="reference")
    assert (rec.ids[0, 3:6] >= 0).all()  # stale in the buffer
    rec.save(tmp_path / "cap.safetensors")
    back = RoutingRecorder.load(tmp_path / "cap.safetensors")
    assert torch.equal(back.layer_ids(0), rec.layer_ids(0)) and (back.ids[0, 3:] == -1).all()


def test_a_layer_never_recorded_has_no_rows_and_bad_counts_do_not_load(tmp_path):
    rec = RoutingRecorder(num_layers=2, max_tokens=4, top_k=3, num_experts=8)
    assert rec.layer_ids(1).shape == (0, 3)
    ids = torch.full((1, 2, 3), -1, dtype=torch.int32)
    assert RoutingRecorder.load(_capture_file(tmp_path / "never.safetensors", ids, [-1], num_experts=8,
                                              top_k=3)).layer_ids(0).shape == (0, 3)
    with pytest.raises(ValueError, match="num_tokens=-2, outside"):
        RoutingRecorder.load(_capture_file(tmp_path / "neg.safetensors", ids, [-2], num_experts=8, top_k=3))


def test_int16_holds_ids_up_to_32767():
    """int16 takes a model of 32768 ids (0-32767), not one more: at the boundary, from the constructor and from a
    loaded file alike."""
    rec = RoutingRecorder(1, 1, 1, 32768, dtype=torch.int16)
    x = torch.full((1, 32768), -5.0)
    x[0, 32767] = 5.0
    route(x, RouterConfig(num_experts=32768, top_k=1), recorder=rec, backend="reference")
    assert rec.layer_ids(0).tolist() == [[32767]]
    with pytest.raises(ValueError, match="int16"):
        RoutingRecorder(1, 1, 1, 32769, dtype=torch.int16)


@pytest.mark.parametrize("name", ["deepseek-v3", "qwen3-moe", "mixtral"])
def test_replay_routes_the_recorded_experts_again(name, tmp_path):
    """A capture saved, loaded and replayed through hash routing gives back the recorded call's ids and weights,
    bit for bit, on an EP layout with a per-rank shared slot, EPLB replicas and padded rows; the padded rows stay
    padding. On other logits the ids stay the recorded ones."""
    from moegate import ExpertLayout, ExpertPlacement, preset

    cfg = preset(name)
    E, K, T, valid = cfg.num_experts, cfg.top_k, 40, 33
    placement = ExpertPlacement(tuple(range(E)) + tuple(range(8)), E)
    layout = ExpertLayout(shared_slots="per_rank", ep_size=2, placement=placement)
    gen = torch.Generator().manual_seed(7)
    bias = torch.randn(E, generator=gen) * 0.01 if cfg.has_correction_bias else None
    rec = RoutingRecorder(2, T, K, E)
    logits = [torch.randn(T, E, generator=gen) for _ in range(2)]
    calls = [route(x, cfg, layout, bias=bias, home_rank=1, num_valid_tokens=valid, recorder=rec, layer=i)
             for i, x in enumerate(logits)]
    rec.save(tmp_path / "cap.safetensors")
    loaded = RoutingRecorder.load(tmp_path / "cap.safetensors")
    hashed = cfg.replace(routing="hash")
    for i, (w, ids) in enumerate(calls):
        table, token_ids, num_valid = loaded.replay(i)
        assert num_valid == valid and table.shape == (T, K) and token_ids.tolist() == list(range(T))
        w2, ids2 = route(logits[i], hashed, layout, bias=bias, home_rank=1, num_valid_tokens=num_valid,
                         hash_table=table, token_ids=token_ids)
        assert torch.equal(ids2, ids) and torch.equal(w2, w)
        other = torch.randn(T, E, generator=gen)
        _w3, ids3 = route(other, hashed, bias=bias, num_valid_tokens=num_valid, hash_table=table, token_ids=token_ids)
        assert torch.equal(ids3[:valid].long(), rec.ids[i, :valid].long())


def test_replay_refuses_what_it_cannot_replay():
    rec = RoutingRecorder(2, 4, 2, 8)
    with pytest.raises(ValueError, match="never recorded"):
        rec.replay(0)
    with pytest.raises(ValueError, match="layer"):
        rec.replay(2)
    rec.record(1, torch.tensor([[0, 1], [-1, -1], [2, 3]], dtype=torch.int32))
    with pytest.raises(ValueError, match="padded rows must come last"):
        rec.replay(1)
    # A row half padding, before no other padding (a review: only the case above was tried, which the first
    # clause catches; without the second clause replay returned a table holding -1).
    rec.record(1, torch.tensor([[0, 1], [-1, 3]], dtype=torch.int32))
    with pytest.raises(ValueError, match="padded rows must come last"):
        rec.replay(1)


def test_replay_of_an_empty_batch_routes():
    rec = RoutingRecorder(1, 4, 2, 8)
    route(torch.randn(0, 8), RouterConfig(num_experts=8, top_k=2), recorder=rec, layer=0)
    table, token_ids, num_valid = rec.replay(0)
    assert token_ids.numel() == 0 and num_valid == 0 and table.shape == (1, 2)
    w, ids = route(torch.randn(0, 8), RouterConfig(num_experts=8, top_k=2, routing="hash"), hash_table=table,
                   token_ids=token_ids, num_valid_tokens=num_valid)
    assert w.shape == ids.shape == (0, 2)


def test_record_checks_its_ids_and_never_broadcasts_or_wraps():
    """RoutingRecorder.record is public: a [T, 1] or 1-D tensor would broadcast into the [T, K] rows, ids past the
    recorder's num_experts would be recorded (or wrapped in int16). Each is a ValueError (float ids or a list: a
    TypeError); nothing is written."""
    rec = RoutingRecorder(2, 4, 4, 16)
    for bad, match, error in ((torch.tensor([[3], [5]]), "top_k=4", ValueError),
                              (torch.tensor([1, 2, 3, 4]), r"\[T, K\]", ValueError),
                              (torch.zeros(5, 4, dtype=torch.int64), "max_tokens=4", ValueError),
                              (torch.zeros(2, 4), "integer", TypeError), ([[0, 1, 2, 3]], "integer", TypeError),
                              (torch.tensor([[0, 1, 2, 16]]), r"\[-1, num_experts=16\)", ValueError),
                              (torch.tensor([[0, 1, 2, -2]]), r"got \[-2, 2\]", ValueError)):
        with pytest.raises(error, match=match):
            rec.record(0, bad)
    with pytest.raises(ValueError, match="layer"):
        rec.record(2, torch.zeros(1, 4, dtype=torch.int64))
    assert (rec.ids == -1).all() and (rec.num_tokens == -1).all()
    small = RoutingRecorder(1, 2, 1, 16, dtype=torch.int16)
    with pytest.raises(ValueError, match="got \\[99, 40000\\]"):
        small.record(0, torch.tensor([[40000], [99]]))
    rec.record(1, torch.tensor([[0, 1, 2, 15], [-1, -1, -1, -1]], dtype=torch.int32))
    assert rec.layer_ids(1).tolist() == [[0, 1, 2, 15], [-1, -1, -1, -1]]


def test_load_validates_each_recorded_row(tmp_path):
    """A file whose recorded rows are not a capture route() could write (an id out of range or below -1, a repeat,
    a half-padded row, padding before a live row) does not load; validate=False loads it as it is (moegate check
    lists every such row). Rows past a layer's num_tokens are not read."""
    from safetensors.torch import save_file

    meta = {"format": "moegate.routing/1", "num_experts": "8", "top_k": "2"}
    # Each case its own message (a review: [[-5, -5]] was refused as a repeat, and a check of ids below -1 could go).
    cases = {"outside": ([[0, 8]], "id 8 is outside"), "below -1": ([[-5, 3]], "id -5 is outside"),
             "repeats": ([[3, 3]], "repeats within the row"), "repeats 0": ([[0, 0]], "repeats within the row"),
             "padded row": ([[-1, 3]], "must be all -1"),
             "live row after": ([[-1, -1], [1, 2]], "a live row after the padded row 0")}
    for name, (rows, match) in cases.items():
        ids = torch.full((1, 3, 2), -1, dtype=torch.int32)
        ids[0, :len(rows)] = torch.tensor(rows, dtype=torch.int32)
        path = tmp_path / f"{name}.safetensors"
        save_file({"ids": ids, "num_tokens": torch.tensor([len(rows)])}, str(path), meta)
        with pytest.raises(ValueError, match="layer 0, row .*" + match):
            RoutingRecorder.load(path)
        assert RoutingRecorder.load(path, validate=False).layer_ids(0).tolist() == rows
    ids = torch.full((1, 3, 2), -1, dtype=torch.int32)
    ids[0, 0] = torch.tensor([7, 0])
    ids[0, 2] = torch.tensor([9, 9])  # past num_tokens: never read
    save_file({"ids": ids, "num_tokens": torch.tensor([1])}, str(tmp_path / "ok.safetensors"), meta)
    assert RoutingRecorder.load(tmp_path / "ok.safetensors").layer_ids(0).tolist() == [[7, 0]]


def test_load_refuses_what_the_constructor_refuses(tmp_path):
    """No layers, zero-wide rows, or a num_tokens that is not integers (2.9 would be read as 2) do not load."""
    from safetensors.torch import save_file

    meta = {"format": "moegate.routing/1", "num_experts": "8"}
    for ids, num_tokens in ((torch.zeros(0, 2, 2, dtype=torch.int32), torch.zeros(0, dtype=torch.int64)),
                            (torch.zeros(1, 2, 0, dtype=torch.int32), torch.tensor([0])),
                            (torch.zeros(1, 2, 2, dtype=torch.int32), torch.tensor([2.9])),
                            (torch.zeros(1, 2, 2, dtype=torch.int32), torch.tensor([True]))):
        path = tmp_path / "bad.safetensors"
        save_file({"ids": ids, "num_tokens": num_tokens}, str(path), meta)
        with pytest.raises(ValueError, match="layers >= 1"):
            RoutingRecorder.load(path)


def test_a_recorder_on_another_device_is_refused():
    """A recorder's buffers on another device than the logits (or the ids given to record()) is a ValueError before
    anything is written (a review: deleting the check passed every test; the meta device stands in for a GPU)."""
    rec = RoutingRecorder(num_layers=1, max_tokens=4, top_k=2, num_experts=8, device="meta")
    with pytest.raises(ValueError, match="recorder is on meta, but logits are on cpu"):
        route(torch.randn(3, 8), RouterConfig(num_experts=8, top_k=2), recorder=rec, backend="reference")
    with pytest.raises(ValueError, match="recorder is on meta, but ids are on cpu"):
        rec.record(0, torch.zeros(3, 2, dtype=torch.int32))


def test_check_batch_refuses_one_past_its_bounds():
    """check_batch is the recorder's only check on the Triton path (the kernel writes recorder.ids; record() is the
    reference's): a batch one row past max_tokens, or a config of one more id than num_experts, is refused before any
    launch, even where the routed ids would fit (a mutation review: both bounds off by one went unseen, record()
    repeating them on the CPU)."""
    rec = RoutingRecorder(num_layers=1, max_tokens=4, top_k=2, num_experts=8)
    cpu = torch.device("cpu")
    rec.check_batch(0, 4, 2, 8, cpu)  # at the bounds: taken
    with pytest.raises(ValueError, match="max_tokens=4 rows, but the batch has T=5"):
        rec.check_batch(0, 5, 2, 8, cpu)
    with pytest.raises(ValueError, match="num_experts=8, but the config routes ids up to 8"):
        rec.check_batch(0, 4, 2, 9, cpu)
    # Through route: expert 8 of 9 never picked (its logit far below the rest), still refused, nothing recorded.
    logits = torch.randn(3, 9)
    logits[:, 8] = -100.0
    with pytest.raises(ValueError, match="num_experts=8"):
        route(logits, RouterConfig(9, 2), recorder=rec, backend="reference")
    assert (rec.ids == -1).all()
