"""MoE routing bins from real (tiny, random-weight) Hugging Face MoE models and registered
routers."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import chakra_hooks.collectors.torch as ct  # noqa: E402
from chakra_hooks.collectors.torch.moe import detect_router  # noqa: E402

WINDOW = range(1, 3)


def _mixtral():
    cfg = transformers.MixtralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=64)
    return transformers.MixtralForCausalLM(cfg), 4, 2


def _olmoe():
    cfg = transformers.OlmoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=2, num_experts=8, num_experts_per_tok=3,
        max_position_embeddings=64)
    return transformers.OlmoeForCausalLM(cfg), 8, 3


def _qwen2_moe():
    cfg = transformers.Qwen2MoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=32, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, num_experts=6, num_experts_per_tok=2, max_position_embeddings=64)
    return transformers.Qwen2MoeForCausalLM(cfg), 6, 2


def _qwen3_moe():
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=32, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        num_experts=6, num_experts_per_tok=2, max_position_embeddings=64)
    return transformers.Qwen3MoeForCausalLM(cfg), 6, 2


def _gpt_oss():
    cfg = transformers.GptOssConfig(
        vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=64, sliding_window=8)
    return transformers.GptOssForCausalLM(cfg), 4, 2


def _deepseek_v3():
    cfg = transformers.DeepseekV3Config(
        vocab_size=64, hidden_size=32, intermediate_size=32, moe_intermediate_size=16,
        num_hidden_layers=2, first_k_dense_replace=0, num_attention_heads=2,
        num_key_value_heads=2, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
        n_group=2, topk_group=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=16, max_position_embeddings=64)
    return transformers.DeepseekV3ForCausalLM(cfg), 8, 2


def _train(model, t, steps: int, recount: dict, batch=(2, 8)) -> None:
    """Train ``steps`` steps; our own hooks keep each router's indices for the recount."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = [0]
    names = {m: n for n, m in model.named_modules()}

    def keep(mod, args, out):
        if step[0] in WINDOW:
            recount[(step[0], names[mod])].append(out[2].detach().clone())

    handles = [m.register_forward_hook(keep) for m in names if detect_router(m)]
    try:
        for i in range(steps):
            step[0] = i
            ids = torch.randint(0, 64, batch)
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
            t.step()
    finally:
        for h in handles:
            h.remove()


FAMILIES = [_mixtral, _olmoe, _qwen2_moe, _qwen3_moe, _gpt_oss, _deepseek_v3]


@pytest.mark.parametrize(
    "build,pass_model",
    [(f, True) for f in FAMILIES] + [(_mixtral, False), (_olmoe, False)],
    ids=[f.__name__[1:] for f in FAMILIES] + ["mixtral-autodetect", "olmoe-autodetect"])
def test_bins_equal_a_recount_from_the_routers_output(tmp_path, build, pass_model):
    torch.manual_seed(0)
    model, experts, top_k = build()
    routers = [n for n, m in model.named_modules() if detect_router(m)]
    assert routers and all(n.endswith(("mlp.gate", "mlp.router")) for n in routers)
    recount: dict = defaultdict(list)
    with ct.trace(tmp_path, steps=WINDOW, model=model if pass_model else None) as t:
        _train(model, t, 4, recount)
    records = json.loads((tmp_path / "routing.rank0.json").read_text())["records"]
    assert len(records) == len(WINDOW) * len(routers)  # one per layer and step, no more
    for rec in records:
        assert rec["num_experts"] == experts and rec["top_k"] == top_k
        assert rec["tokens"] == 16 and sum(rec["bins"]) == rec["tokens"] * top_k
        assert rec["dropped"] == 0 and rec["ep_bins"] is None
        assert rec["end_ns"] > rec["start_ns"]
        assert rec["annotation"] == f"moe_router:layer{rec['layer']}"
        name = routers[rec["layer"]]
        if pass_model:
            assert rec["module"] == name
        (indices,) = recount[(rec["step"], name)]
        assert rec["bins"] == torch.bincount(indices.flatten(), minlength=experts).tolist()
    # The routing regions are in both traces, with the same count.
    et = [n["name"] for n in json.loads((tmp_path / "host_et.rank0.json").read_text())["nodes"]]
    kineto = [e["name"] for e in json.loads((tmp_path / "kineto.rank0.pt.trace.json").read_text())
              ["traceEvents"] if e.get("cat") == "user_annotation"]
    for names in (et, kineto):
        assert sum(n.startswith("moe_router:layer") for n in names) == len(records)


class RoutingMapRouter(torch.nn.Module):
    """Returns (probs, routing_map bool [tokens, experts]) like Megatron-core's TopKRouter
    (which needs CUDA and cannot run here), registered explicitly."""

    def __init__(self, experts: int, top_k: int) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, experts)
        self.top_k = top_k

    def forward(self, x):
        probs = self.proj(x).softmax(-1)
        top = probs.topk(self.top_k, dim=-1).indices
        routing_map = torch.zeros_like(probs, dtype=torch.bool).scatter(1, top, True)
        return probs, routing_map


def test_registered_routing_map_router_with_expert_parallel_bins(tmp_path):
    torch.manual_seed(1)
    router = RoutingMapRouter(experts=8, top_k=2)
    ct.register_router(router, num_experts=8, top_k=2, name="decoder.layers.5.mlp.router",
                       ep_size=4)
    maps = []
    hooks_before = len(router._forward_hooks)
    with ct.trace(tmp_path, steps=range(0, 2)) as t:
        for _ in range(3):
            maps.append(router(torch.randn(10, 8))[1])
            t.step()
    assert len(router._forward_hooks) == hooks_before  # hooks exist only inside the window
    records = json.loads((tmp_path / "routing.rank0.json").read_text())["records"]
    assert [r["step"] for r in records] == [0, 1]
    for rec, rmap in zip(records, maps):
        bins = rmap.sum(0).tolist()
        assert rec["layer"] == 5 and rec["tokens"] == 10 and rec["bins"] == bins
        assert rec["ep_size"] == 4
        assert rec["ep_bins"] == [bins[0] + bins[1], bins[2] + bins[3], bins[4] + bins[5],
                                  bins[6] + bins[7]]


def test_out_of_range_expert_ids_are_counted_as_dropped(tmp_path):
    class PaddedRouter(torch.nn.Module):
        def forward(self, x):
            return torch.tensor([[0, 1], [4, 1], [-1, 3]])  # 4 and -1: padding ids

    router = PaddedRouter()
    ct.register_router(router, num_experts=4, top_k=2, layer=0)
    with ct.trace(tmp_path, steps=[0]) as t:
        router(torch.zeros(1))
        t.step()
    (rec,) = json.loads((tmp_path / "routing.rank0.json").read_text())["records"]
    assert rec["bins"] == [1, 2, 0, 1] and rec["dropped"] == 2 and rec["tokens"] == 3


def test_register_router_rejects_bad_layouts():
    with pytest.raises(ValueError):
        ct.register_router(torch.nn.Linear(2, 2), num_experts=6, top_k=2, ep_size=4)
    with pytest.raises(ValueError):
        ct.register_router(torch.nn.Linear(2, 2), num_experts=0, top_k=2)


def test_a_failing_routing_hook_never_breaks_the_forward(tmp_path, caplog):
    router = torch.nn.Linear(4, 4)

    def bad_select(out):
        raise KeyError("no indices here")

    ct.register_router(router, num_experts=4, top_k=1, layer=0, select=bad_select)
    with ct.trace(tmp_path, steps=[0]) as t:
        y = router(torch.randn(3, 4))
        t.step()
    assert y.shape == (3, 4)
    assert any("routing bins" in r.message for r in caplog.records)
    man = json.loads((tmp_path / "manifest.json").read_text())
    assert man["complete"] is False and "routing bins" in man["rank_status"]["0"]["error"]
    assert "kineto" in man["ranks"]["0"]  # the rest of the capture is still written


def test_batched_indices_count_every_token(tmp_path):
    class BatchedRouter(torch.nn.Module):  # indices [batch, seq, top_k], not flattened
        def forward(self, x):
            return x, torch.randint(0, 5, (2, 3, 2))

    router = BatchedRouter()
    ct.register_router(router, num_experts=5, top_k=2, layer=1)
    with ct.trace(tmp_path, steps=[0]) as t:
        _, ids = router(torch.zeros(1))
        t.step()
    (rec,) = json.loads((tmp_path / "routing.rank0.json").read_text())["records"]
    assert rec["tokens"] == 6 and rec["bins"] == torch.bincount(ids.flatten(), minlength=5).tolist()


class Gate(torch.nn.Module):
    """The interface of NeMo AutoModel's ``Gate`` (nemo_automodel.components.moe.layers),
    which needs grouped_gemm / CUDA to import: ``n_experts``, ``topk``, and a forward that
    returns (weights, indices, aux_loss)."""

    def __init__(self, dim: int = 8, n_experts: int = 6, topk: int = 2) -> None:
        super().__init__()
        self.n_experts, self.topk = n_experts, topk
        self.weight = torch.nn.Parameter(torch.randn(n_experts, dim))

    def forward(self, x, token_mask=None, cp_mesh=None):
        values, indices = torch.nn.functional.linear(x, self.weight).topk(self.topk, dim=-1)
        return values.softmax(dim=1), indices, None


def test_automodel_gate_is_found_by_itself(tmp_path):
    torch.manual_seed(2)
    block = torch.nn.ModuleDict({"gate": Gate()})
    model = torch.nn.ModuleDict({"layers": torch.nn.ModuleList([block])})
    chosen = []
    with ct.trace(tmp_path, steps=[0], model=model) as t:
        chosen.append(model["layers"][0]["gate"](torch.randn(9, 8))[1])
        t.step()
    (rec,) = json.loads((tmp_path / "routing.rank0.json").read_text())["records"]
    assert (rec["layer"], rec["num_experts"], rec["top_k"], rec["tokens"]) == (0, 6, 2, 9)
    assert rec["bins"] == torch.bincount(chosen[0].flatten(), minlength=6).tolist()


def test_training_only_counts_neither_eval_nor_recomputation(tmp_path):
    """With routing_training_only: a training forward counts; the same router in eval mode and
    its re-run by activation checkpointing during backward do not."""
    torch.manual_seed(3)
    gate = Gate()
    ct.register_router(gate, num_experts=6, top_k=2, layer=0)
    x = torch.randn(5, 8, requires_grad=True)
    with ct.trace(tmp_path, steps=[0], routing_training_only=True) as t:
        weights = torch.utils.checkpoint.checkpoint(lambda v: gate(v)[0], x, use_reentrant=False)
        weights.sum().backward()  # recomputes gate's forward inside the backward pass
        gate.eval()
        gate(torch.randn(7, 8))  # validation-style call
        gate.train()
        t.step()
    (rec,) = json.loads((tmp_path / "routing.rank0.json").read_text())["records"]
    assert rec["tokens"] == 5
