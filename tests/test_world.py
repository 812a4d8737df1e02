"""The world's data: a counter-based draw with fixed bits, on the case's device, drawn once per case.

The GPU tests check what the CPU cannot: the same seed gives the same bits on CUDA as on the CPU (so
a replay on the other device is exact), and the float64 reference computed there agrees with the
CPU's. The `meta` device stands in for a GPU on the CPU: an op mixing a CPU tensor into a world on
another device fails there as it would on CUDA.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.case import Batch, Case, Dims, Mutation, Request
from harness.engine import run_case
from harness.model import attention
from harness.model.attention import reference_attention
from harness.oracles.float64 import FLOAT64_ATOL
from harness.targets.reference import ReferenceTarget, make_forward_batch
from harness.world import (CaseWorlds, PoolSizes, build_world, draw_integers, draw_uniform, kv_contents,
                           same_device)

SMALL = Case(batches=(Batch(requests=(Request(20, 9), Request(3, 6)), mutations=(Mutation("swa_clear", count=2),)),
                      Batch(requests=(Request(0, 5),), graph=True)))
WIDE = Case(dims=Dims(heads=4, head_dim=16, swa_window=8, index_topk=4, index_dim=8, page_size=4),
            batches=(Batch(requests=(Request(40, 13), Request(3, 6))),))
MODEL_DATA = ("q", "q_index", "sink")


def test_the_generator_s_bits_are_fixed():
    """A change to the generator changes every case's data: a stored case would replay other values."""
    assert draw_uniform((6,), 1, 0).tolist() == [-0.40813541412353516, -0.37798547744750977, 1.924919605255127,
                                                   0.2528395652770996, -0.511326789855957, 0.9887046813964844]
    assert draw_integers((6,), -4, 5, 1, 1).tolist() == [-2.0, -4.0, -4.0, 2.0, 3.0, -2.0]


def test_draws_are_spread_distinct_per_stream_and_independent_of_the_cpu_chunking():
    values = draw_uniform(((1 << 19) + 3,), 7, 0)  # more than one chunk on the CPU
    assert values.min() >= -2 and values.max() < 2 and abs(float(values.mean())) < 0.01
    assert abs(float(values.var()) - 4 / 3) < 0.01
    assert values.unique().numel() > 0.9 * values.numel()
    assert not torch.equal(values[:1000], draw_uniform((1000,), 7, 1))  # another tensor of the same world
    assert not torch.equal(values[:1000], draw_uniform((1000,), 8, 0))  # another seed
    assert torch.equal(values[:1000], draw_uniform((1000,), 7, 0))  # a prefix does not depend on the length
    ints = draw_integers((10_000,), -4, 5, 7, 2)
    assert set(ints.tolist()) == set(range(-4, 5))


def test_the_world_the_load_and_the_reference_stay_on_the_world_s_device():
    """On `meta` any CPU tensor mixed in fails, as it would on CUDA."""
    world = build_world(WIDE, 0, PoolSizes.for_case(WIDE), "meta")
    assert {t.device.type for t in (world.q, world.q_index, world.sink, *world.latents, *world.index_keys)} == {"meta"}
    for layer in range(len(WIDE.dims.layer_ratios)):
        for keys in ("gathered", "masked"):
            assert reference_attention(world, layer, keys=keys).device.type == "meta"
    for index, values in kv_contents(world, after_forward=True).values():
        assert {t.device.type for t in (*index, values)} == {"meta"}
    batch = make_forward_batch(world, WIDE, torch.device("meta"))
    assert {t.device.type for t in vars(batch).values() if isinstance(t, torch.Tensor)} == {"meta"}


LONG = Case(dims=Dims(heads=4, head_dim=16, swa_window=8, index_topk=4, index_dim=8, page_size=4),
            batches=(Batch(requests=(Request(0, 7), Request(300, 45), Request(2, 1))),))


@pytest.mark.parametrize("scores_per_step", [attention.MASKED_SCORES_PER_STEP, 4 * 300], ids=["one-step", "row-steps"])
@pytest.mark.parametrize("case", [WIDE, LONG], ids=["wide", "long"])
def test_masked_keys_give_the_gathered_keys_sums(case, scores_per_step, monkeypatch):
    """The GPU's way (every key of the request, masked) against the CPU's (each row's keys gathered), on
    rows out of order, both ends of each request, and a request of one token: the same sums in another
    order, so equal to float64 rounding; a key set wrong by one (window or top-k) would be off by far more."""
    monkeypatch.setattr(attention, "MASKED_SCORES_PER_STEP", scores_per_step)  # the second: a step of 1-3 rows
    world = build_world(case, 0, PoolSizes.for_case(case))
    rows = sorted(range(world.num_tokens), key=lambda t: (t * 7919) % world.num_tokens)
    for layer in range(len(case.dims.layer_ratios)):
        gathered = reference_attention(world, layer, rows=rows, keys="gathered")
        masked = reference_attention(world, layer, rows=rows, keys="masked")
        assert (gathered - masked).abs().max() < 1e-12, layer
        assert torch.equal(gathered, reference_attention(world, layer, keys="gathered")[rows])


def test_a_reference_asked_for_an_unknown_key_layout_says_which_there_are():
    world = build_world(WIDE, 0, PoolSizes.for_case(WIDE))
    with pytest.raises(ValueError, match="gathered or masked"):
        reference_attention(world, 0, keys="dense")


def test_an_fp8_v4_world_holds_what_dsv4_s_cache_and_bf16_hold_exactly():
    """NoPE latents are quarters in [-2, 2] (at most 4 significant bits: exact in e4m3 under any power-of-two
    tile scale), RoPE latents and queries bf16 values, block means the same; the float32 format is untouched."""
    dims = Dims(heads=2, head_dim=512, swa_window=8, index_topk=512, page_size=256, kv_format="fp8_v4")
    case = Case(dims=dims, batches=(Batch(requests=(Request(130, 9), Request(3, 6))),))
    world = build_world(case, 0, PoolSizes.for_case(case))
    for latents in [*world.latents, world.block_means(0, 1, 4), world.block_means(0, 2, 128)]:
        nope, rope = latents[..., :448], latents[..., 448:]
        assert torch.equal(nope * 4, torch.round(nope * 4)) and nope.abs().max() <= 2
        assert torch.equal(rope, rope.to(torch.bfloat16).float())
    assert torch.equal(world.q, world.q.to(torch.bfloat16).float())
    plain = build_world(dataclasses.replace(case, dims=dataclasses.replace(dims, kv_format="float32")), 0,
                        PoolSizes.for_case(case))
    assert not torch.equal(plain.q, plain.q.to(torch.bfloat16).float())  # the default keeps its fine values
    assert torch.equal(world.q, plain.q.to(torch.bfloat16).float())  # the same draw, rounded


def test_a_case_s_worlds_are_drawn_once_for_both_runs_and_never_written():
    worlds = CaseWorlds(SMALL)
    first = worlds[0, torch.device("cpu")]
    assert worlds[0, torch.device("cpu")] is first
    with pytest.raises(ValueError, match="is on cpu, asked for on meta"):
        worlds[0, torch.device("meta")]
    before = {name: getattr(first, name).clone() for name in MODEL_DATA}
    result = run_case(ReferenceTarget(), SMALL, "cpu")
    assert not result.findings
    assert result.overlapped.worlds[0] is result.barriered.worlds[0]
    for name in MODEL_DATA:
        assert torch.equal(getattr(result.overlapped.worlds[0], name), before[name]), name
    assert result.world_seconds > 0 and set(result.phases()) >= {"world", "oracles", "overlapped_forward"}


def test_a_device_without_an_index_is_the_one_its_tensors_are_on():
    """A CUDA tensor's device is `cuda:0`, the device a run asks for `cuda`: the same world."""
    assert same_device(torch.device("cuda:0"), torch.device("cuda"))
    assert same_device(torch.device("cpu"), torch.device("cpu"))
    assert not same_device(torch.device("cuda:0"), torch.device("cuda:1"))
    assert not same_device(torch.device("cuda:0"), torch.device("cpu"))


def test_a_target_that_writes_into_its_inputs_does_not_change_the_shared_world():
    world = build_world(SMALL, 0, PoolSizes.for_case(SMALL))
    batch = make_forward_batch(world, SMALL, torch.device("cpu"))
    before = make_forward_batch(world, SMALL, torch.device("cpu"))
    for tensor in vars(batch).values():
        if isinstance(tensor, torch.Tensor):
            tensor.zero_()
    assert world.q.abs().sum() > 0 and world.latents[0].abs().sum() > 0
    again = make_forward_batch(world, SMALL, torch.device("cpu"))  # the inputs derived once, copied per run
    for name, tensor in vars(before).items():
        if isinstance(tensor, torch.Tensor):
            assert torch.equal(getattr(again, name), tensor), name
    assert before.positions.abs().sum() > 0 and before.compressed_new.abs().sum() > 0


def _all_tensors(world):
    return {"q": world.q, "q_index": world.q_index, "sink": world.sink,
            **{f"latents[{r}]": t for r, t in enumerate(world.latents)},
            **{f"index_keys[{r}]": t for r, t in enumerate(world.index_keys)}}


@pytest.mark.gpu
@pytest.mark.parametrize("case", [SMALL, WIDE], ids=["small", "wide"])
def test_a_seed_draws_the_same_bits_on_cuda_as_on_the_cpu(case):
    sizes = PoolSizes.for_case(case)
    for index in range(len(case.batches)):
        on_cpu, on_gpu = build_world(case, index, sizes), build_world(case, index, sizes, "cuda")
        assert on_gpu.device.type == "cuda"
        for name, tensor in _all_tensors(on_cpu).items():
            assert torch.equal(tensor, _all_tensors(on_gpu)[name].cpu()), name
        assert (on_cpu.full_slots, on_cpu.swa_slots, on_cpu.req_pool_idx) == (
            on_gpu.full_slots, on_gpu.swa_slots, on_gpu.req_pool_idx)


@pytest.mark.gpu
def test_the_float64_reference_on_cuda_agrees_with_the_cpu_s():
    real = Case(dims=Dims(heads=64, head_dim=512, swa_window=128, index_topk=512, index_dim=8, page_size=256),
                batches=(Batch(requests=(Request(600, 300), Request(100, 212))),))
    sizes = PoolSizes.for_case(real)
    on_cpu, on_gpu = build_world(real, 0, sizes), build_world(real, 0, sizes, "cuda")
    rows = list(range(0, on_cpu.num_tokens, 7))
    for layer in range(len(real.dims.layer_ratios)):
        want = reference_attention(on_cpu, layer, rows=rows)
        got = reference_attention(on_gpu, layer, rows=rows)
        assert got.device.type == "cuda"
        # The block means are float32 reductions, whose last bit differs between the CPU and CUDA: the
        # reference then differs by about 1e-10, six orders below the float64 oracle's tolerance.
        assert (got.cpu() - want).abs().max() < FLOAT64_ATOL * 1e-4, layer


def test_a_campaign_says_where_its_time_went():
    from harness.campaign import run_campaign
    from harness.findings import PHASES

    summary = run_campaign(ReferenceTarget(), examples=6, seed=2, profile="dev").summary()
    spent = summary["time"]
    assert set(spent) == {*PHASES, "campaign"}
    assert all(seconds >= 0 for seconds in spent.values())
    assert spent["world"] > 0 and spent["oracles"] > 0 and spent["overlapped_forward"] > 0
    assert abs(sum(spent.values()) - summary["duration_s"]) < 0.01 + 0.01 * summary["duration_s"]
