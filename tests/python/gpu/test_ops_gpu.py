"""tileweave.ops on a GPU against small PyTorch references (skipped with a reason elsewhere).

On the GPU machine: scripts/python_gpu_test.sh (docs/python.md) builds the CUDA extension and
runs this file. fp32 references from the same bf16 inputs; errors are relative L2 norms.
"""

import pytest

from gpu_env import tileweave, torch  # skips this module where there is no GPU, torch or GPU build

from tileweave import ops  # noqa: E402

SM90 = torch.cuda.get_device_capability()[0] == 9
needs_sm90 = pytest.mark.skipif(not SM90, reason="needs an sm_90 GPU (H100/H200)")
DEV = torch.device("cuda")


def rel_err(got, want):
    got, want = got.float(), want.float()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def randn(*shape, std=1.0, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return (torch.randn(*shape, generator=g, device=DEV) * std).to(torch.bfloat16)


# ---- FFN ----


def ffn_ref(x, w_gate_up, w_down, gated, activation="identity"):
    a = x.float() @ w_gate_up.float().T
    if gated:
        f = w_down.shape[1]
        a = torch.nn.functional.silu(a[:, :f]) * a[:, f:]
    elif activation == "relu":
        a = torch.relu(a)
    elif activation == "gelu_tanh":
        a = torch.nn.functional.gelu(a, approximate="tanh")
    h = a.to(torch.bfloat16).float()  # the op keeps h in bf16
    return h @ w_down.float().T


def ffn_weights(d, f, gated, seed=1):
    return (randn((2 if gated else 1) * f, d, std=d ** -0.5, seed=seed), randn(d, f, std=f ** -0.5, seed=seed + 1))


@pytest.mark.parametrize("m", [1, 19, 99])
@pytest.mark.parametrize("d, f", [(256, 512), (520, 1048), (4096, 1024)])
@pytest.mark.parametrize("activation", ["silu", "identity", "relu", "gelu_tanh"])
def test_ffn(m, d, f, activation):
    gated = activation == "silu"
    wgu, wd = ffn_weights(d, f, gated)
    x = randn(m, d, seed=m)
    y = ops.ffn(x, wgu, wd, activation=activation)
    assert y.shape == (m, d) and y.dtype == torch.bfloat16
    assert rel_err(y, ffn_ref(x, wgu, wd, gated, activation)) < 2e-2


@needs_sm90
@pytest.mark.parametrize("m", [1, 19, 99])
@pytest.mark.parametrize("d, f", [(256, 512), (520, 1048)])
def test_ffn_packed_weights(m, d, f):
    wgu, wd = ffn_weights(d, f, True)
    packed = ops.pack_ffn_weights(wgu, wd)
    x = randn(m, d, seed=m)
    y = ops.ffn_packed(x, packed)
    assert rel_err(y, ffn_ref(x, wgu, wd, True)) < 2e-2
    assert rel_err(y, ops.ffn(x, wgu, wd)) < 1e-2


# ---- decode GEMM ----


@needs_sm90
@pytest.mark.parametrize("m", [1, 19, 99])
@pytest.mark.parametrize("n, k", [(8, 8), (1000, 520), (4096, 4096), (14336, 4096)])
@pytest.mark.parametrize("packed", [False, True])
def test_decode_gemm(m, n, k, packed):
    w = randn(n, k, std=k ** -0.5, seed=n)
    x = randn(m, k, seed=m)
    y = ops.decode_gemm(x, ops.pack_gemm_weight(w) if packed else w)
    assert y.shape == (m, n)
    assert rel_err(y, x.float() @ w.float().T) < 1e-2


# ---- decode attention ----


def rope_ref(x, pos, theta):
    """Rotate-half RoPE of x [..., D] at positions pos (broadcast over the leading dims)."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d // 2, device=DEV, dtype=torch.float32) * 2 / d)
    ang = pos.float()[..., None] * inv
    c, s = torch.cos(ang), torch.sin(ang)
    x1, x2 = x[..., : d // 2].float(), x[..., d // 2:].float()
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)


def attention_ref(q, k_rows, v_rows, scale):
    """q [Hq, D] against k/v rows [L, Hkv, D] with GQA; fp32."""
    hq, hkv = q.shape[0], k_rows.shape[1]
    k = k_rows.float().repeat_interleave(hq // hkv, dim=1)  # [L, Hq, D]
    v = v_rows.float().repeat_interleave(hq // hkv, dim=1)
    s = torch.einsum("hd,lhd->hl", q.float(), k) * scale
    return torch.einsum("hl,lhd->hd", torch.softmax(s, -1), v)


class AttnCase:
    """Random q, k_new, v_new and caches for ragged lengths (contiguous or paged, pages shuffled), and
    the fp32 reference of decode_attention on them."""

    def __init__(self, batch, hq, hkv, d, layout, seed, max_len=300):
        g = torch.Generator().manual_seed(seed)
        self.lens = torch.randint(1, max_len, (batch,), generator=g).tolist()  # some shorter than a 16-token unit
        self.lens[0] = 1  # only the new token
        self.q, self.k_new, self.v_new = (randn(batch, hq, d, seed=seed + 1), randn(batch, hkv, d, seed=seed + 2),
                                          randn(batch, hkv, d, seed=seed + 3))
        self.hkv, self.d = hkv, d
        page = 16 if d == 128 else 32
        self.page = page
        if layout == "contiguous":
            s = max_len + 5
            self.k_cache, self.v_cache = randn(batch, hkv, s, d, seed=seed + 4), randn(batch, hkv, s, d, seed=seed + 5)
            self.table = None
        else:
            pages_per_seq = (max_len + page - 1) // page + 1
            per_seq = [(n + page - 1) // page for n in self.lens]
            # Room for every sequence at its longest, so a test may grow the lengths later.
            num_pages = batch * pages_per_seq + 3
            perm = torch.randperm(num_pages, generator=g).tolist()
            self.table = [perm[i * pages_per_seq: (i + 1) * pages_per_seq] for i in range(batch)]
            self.k_cache = randn(num_pages, hkv, page, d, seed=seed + 4)
            self.v_cache = randn(num_pages, hkv, page, d, seed=seed + 5)
        self.k_before, self.v_before = self.k_cache.clone(), self.v_cache.clone()

    def rows(self, cache, b, n):
        """Sequence b's first n rows of a cache, [n, Hkv, D]."""
        if self.table is None:
            return cache[b, :, :n].transpose(0, 1)
        idx = torch.tensor(self.table[b][: (n + self.page - 1) // self.page], device=DEV)
        return cache[idx].transpose(1, 2).reshape(-1, self.hkv, self.d)[:n]

    def check(self, out, lens, theta):
        """out against the reference for these lengths; the caches hold the appended rows and nothing
        else changed (from the state saved at construction, or at the last reset())."""
        worst = 0.0
        for b, n in enumerate(lens):
            pos = torch.tensor(n - 1, device=DEV)
            kn = rope_ref(self.k_new[b], pos, theta) if theta else self.k_new[b].float()
            qb = rope_ref(self.q[b], pos, theta) if theta else self.q[b].float()
            k_rows, v_rows = self.rows(self.k_before, b, n).clone(), self.rows(self.v_before, b, n).clone()
            k_rows[-1], v_rows[-1] = kn.to(torch.bfloat16), self.v_new[b]
            assert rel_err(self.rows(self.k_cache, b, n), k_rows) < 1e-2
            assert torch.equal(self.rows(self.v_cache, b, n), v_rows)
            worst = max(worst, rel_err(out[b], attention_ref(qb.to(torch.bfloat16), k_rows, v_rows, self.d ** -0.5)))
        assert worst < 2e-2

    def reset(self):
        self.k_cache.copy_(self.k_before)
        self.v_cache.copy_(self.v_before)


@pytest.mark.parametrize("batch", [1, 19, 99])
@pytest.mark.parametrize("hq, hkv, d", [(32, 8, 128), (7, 1, 64), (8, 8, 64)])
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
@pytest.mark.parametrize("rope", [True, False])
@pytest.mark.parametrize("where", ["host", "gpu"])
def test_decode_attention(batch, hq, hkv, d, layout, rope, where):
    c = AttnCase(batch, hq, hkv, d, layout, seed=batch * 31 + hq)
    theta = 10000.0 if rope else None
    lens, table = c.lens, c.table
    if where == "gpu":  # read by the kernel, int64 converted on the GPU
        lens = torch.tensor(lens, dtype=torch.int64, device=DEV)
        table = None if table is None else torch.tensor(table, dtype=torch.int32, device=DEV)
    out = ops.decode_attention(c.q, c.k_new, c.v_new, c.k_cache, c.v_cache, lens, page_table=table, rope_theta=theta)
    assert out.shape == c.q.shape
    c.check(out, c.lens, theta)


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_decode_attention_graph_replays_see_new_lengths(layout):
    """Lengths on the GPU: one plan for every length, and a captured CUDA graph replayed after the
    lengths (and the page table) change computes with the new ones."""
    c = AttnCase(7, 16, 4, 128, layout, seed=5)
    lens = torch.tensor(c.lens, dtype=torch.int32, device=DEV)
    table = None if c.table is None else torch.tensor(c.table, dtype=torch.int32, device=DEV)

    def run():
        return ops.decode_attention(c.q, c.k_new, c.v_new, c.k_cache, c.v_cache, lens, page_table=table)

    ops.clear_plans()
    run()  # the plan is made outside the capture
    torch.cuda.synchronize()
    c.reset()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    g = torch.Generator().manual_seed(9)
    for _ in range(3):
        new = torch.randint(1, 300, (7,), generator=g).tolist()
        lens.copy_(torch.tensor(new, dtype=torch.int32))
        if table is not None:  # the sequences' pages in another order
            c.table = [row[::-1] for row in c.table]
            table.copy_(torch.tensor(c.table, dtype=torch.int32))
        c.reset()
        graph.replay()
        torch.cuda.synchronize()
        c.check(out, new, 10000.0)
    assert sum(1 for key in ops._plans if key[0] == "AttentionPlan") == 1
    ops.check_errors()  # nothing to report


def test_decode_attention_compiled_over_changing_lengths():
    """Inside torch.compile (CUDA graphs), lengths on the GPU changing from call to call."""
    c = AttnCase(5, 8, 2, 64, "contiguous", seed=11)
    compiled = torch.compile(lambda lens: ops.decode_attention(c.q, c.k_new, c.v_new, c.k_cache, c.v_cache, lens),
                             mode="reduce-overhead", fullgraph=True)
    g = torch.Generator().manual_seed(3)
    for _ in range(4):
        new = torch.randint(1, 300, (5,), generator=g).tolist()
        c.reset()
        out = compiled(torch.tensor(new, dtype=torch.int32, device=DEV))
        torch.cuda.synchronize()
        c.check(out, new, 10000.0)


# ---- torch.compile and CUDA graphs ----


@needs_sm90
def test_compiled_chain_under_cuda_graphs_matches_eager():
    """ffn -> decode_gemm in a torch.compile graph with CUDA graphs (mode reduce-overhead)."""
    d, f, n = 512, 1024, 768
    wgu, wd = ffn_weights(d, f, True)
    w = randn(n, d, std=d ** -0.5, seed=9)

    def chain(x):
        return ops.decode_gemm(ops.ffn(x, wgu, wd) * 2, w)

    compiled = torch.compile(chain, mode="reduce-overhead", fullgraph=True)
    for step in range(4):  # warm-up runs, then replays of the recorded graph
        x = randn(16, d, seed=100 + step)
        want = chain(x)
        got = compiled(x)
        torch.cuda.synchronize()
        assert rel_err(got, want) < 1e-2, f"step {step}"


def test_explicit_cuda_graph_capture_and_replay():
    d, f = 256, 512
    wgu, wd = ffn_weights(d, f, True)
    x = randn(19, d, seed=1)
    ops.ffn(x, wgu, wd)  # the plan is made outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = ops.ffn(x, wgu, wd)
    for seed in (2, 3):
        x.copy_(randn(19, d, seed=seed))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(y, ffn_ref(x, wgu, wd, True)) < 2e-2


# ---- a whole decode step ----


def step_ref(cfg, w, history):
    """Logits [vocab] of the last position of `history` (token ids), fp32, no cache."""
    t = torch.tensor(history, device=DEV)
    hq, hkv, hd = cfg["num_q_heads"], cfg["num_kv_heads"], cfg["head_dim"]
    inv = torch.tensor(cfg["rope_inv_freq"], device=DEV)
    ang = torch.arange(len(history), device=DEV).float()[:, None] * inv
    cos, sin = torch.cos(ang)[:, None], torch.sin(ang)[:, None]

    def rope(x):  # [T, H, hd]
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    def norm(x, name):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + cfg["rms_norm_eps"]) * w[name].float()

    def lin(x, name, bias=False):
        y = x @ w[name + ".weight"].float().T
        return y + w[name + ".bias"].float() if bias else y

    h = w["model.embed_tokens.weight"].float()[t]
    mask = torch.full((len(history), len(history)), float("-inf"), device=DEV).triu(1)
    for i in range(cfg["num_layers"]):
        p = f"model.layers.{i}."
        x = norm(h, p + "input_layernorm.weight")
        q = rope(lin(x, p + "self_attn.q_proj", cfg["qkv_bias"]).view(-1, hq, hd))
        k = rope(lin(x, p + "self_attn.k_proj", cfg["qkv_bias"]).view(-1, hkv, hd)).repeat_interleave(hq // hkv, 1)
        v = lin(x, p + "self_attn.v_proj", cfg["qkv_bias"]).view(-1, hkv, hd).repeat_interleave(hq // hkv, 1)
        s = torch.einsum("thd,uhd->htu", q, k) * hd ** -0.5 + mask
        o = torch.einsum("htu,uhd->thd", torch.softmax(s, -1), v).reshape(len(history), -1)
        h = h + lin(o, p + "self_attn.o_proj")
        x = norm(h, p + "post_attention_layernorm.weight")
        h = h + lin(torch.nn.functional.silu(lin(x, p + "mlp.gate_proj")) * lin(x, p + "mlp.up_proj"), p + "mlp.down_proj")
    x = norm(h[-1], "model.norm.weight")
    head = w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    return x @ head.float().T


@needs_sm90
@pytest.mark.parametrize("config, batch, paged", [("tiny-llama", 1, False), ("tiny-qwen2", 3, True)])
def test_decode_step_against_torch(config, batch, paged):
    cfg = tileweave._tileweave.model_config(config)
    w = ops.random_state_dict(config, seed=7)
    st = ops.DecodeStep(config, batch=batch, max_seq_len=64, paged=paged, keep_logits=True)
    st.load_state_dict(w)
    st.set_lengths([0] * batch)
    history = [[1 + b] for b in range(batch)]
    st.set_tokens([h[0] for h in history])
    for step in range(6):
        st.step()
        logits = st.logits.clone()
        sampled = st.tokens.tolist()
        for b in range(batch):
            ref = step_ref(cfg, w, history[b])
            assert rel_err(logits[b], ref) < 3e-2, f"step {step} sequence {b}"
            assert sampled[b] == int(logits[b].argmax()), "the sampled token is the argmax of the logits"
            history[b].append(sampled[b])
    assert st.lengths == [6] * batch


@needs_sm90
def test_decode_steps_in_a_cuda_graph_match_launches():
    runs = []
    for use_graph in (False, True):
        st = ops.DecodeStep("tiny-qwen2", batch=2, max_seq_len=64)
        st.random_weights(3)
        st.set_lengths([0, 0])
        st.set_tokens([1, 2])
        st.step()  # the first step runs eagerly (and sets up) in both cases
        if use_graph:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                st.step()
        tokens = []
        for _ in range(5):
            graph.replay() if use_graph else st.step()
            tokens.append(st.tokens.tolist())
        runs.append(tokens)
    assert runs[0] == runs[1]


# ---- bad input names the argument ----


@pytest.mark.parametrize("make, words", [
    (lambda x, wgu, wd: ops.ffn(x.float(), wgu, wd), "x must be torch.bfloat16, got torch.float32"),
    (lambda x, wgu, wd: ops.ffn(x.cpu(), wgu, wd), "x must be on a CUDA device, got cpu"),
    (lambda x, wgu, wd: ops.ffn(x, wgu[:, :128], wd), "w_gate_up must have shape (1024, 256)"),
    (lambda x, wgu, wd: ops.ffn(x, wgu, wd.T.contiguous().T), "w_down must be contiguous"),
    (lambda x, wgu, wd: ops.ffn(x, wgu, wd, activation="gelu"), "activation must be 'silu'"),
    (lambda x, wgu, wd: ops.ffn(x[None], wgu, wd), "x must have 2 dimensions"),
    (lambda x, wgu, wd: ops.ffn(torch.empty(4 * 256 + 1, dtype=torch.bfloat16, device=DEV)[1:].view(4, 256), wgu, wd),
     "x must be 16-byte aligned"),
])
def test_bad_input_names_the_argument(make, words):
    wgu, wd = ffn_weights(256, 512, True)
    x = randn(4, 256)
    with pytest.raises((tileweave.InvalidArgument, TypeError)) as e:
        make(x, wgu, wd)
    assert words in str(e.value)


def test_bad_attention_lengths_are_refused_before_launch():
    q, kn, vn = randn(2, 8, 64), randn(2, 2, 64), randn(2, 2, 64)
    kc, vc = randn(2, 2, 32, 64), randn(2, 2, 32, 64)
    with pytest.raises(tileweave.InvalidArgument, match="lengths has 3 entries for batch 2"):
        ops.decode_attention(q, kn, vn, kc, vc, [4, 5, 6])
    with pytest.raises(tileweave.InvalidArgument, match=r"lengths\[1\] = 40 is outside \[1, 32\]"):
        ops.decode_attention(q, kn, vn, kc, vc, [4, 40])
    with pytest.raises(tileweave.InvalidArgument, match=r"lengths must have shape \(2,\)"):
        ops.decode_attention(q, kn, vn, kc, vc, torch.tensor([4, 5, 6], device=DEV))
    pc, pv = randn(6, 2, 16, 64), randn(6, 2, 16, 64)
    with pytest.raises(tileweave.InvalidArgument, match=r"page_table\[1\]\[1\] = 6 is outside \[0, 6\)"):
        ops.decode_attention(q, kn, vn, pc, pv, [4, 20], page_table=[[0, 1], [2, 6]])


def test_bad_gpu_lengths_give_nan_and_a_named_error():
    """Lengths on the GPU are checked there: the call returns NaN, leaves the caches alone, and
    check_errors names the first bad value."""
    q, kn, vn = randn(2, 8, 64), randn(2, 2, 64), randn(2, 2, 64)
    kc, vc = randn(2, 2, 32, 64), randn(2, 2, 32, 64)
    kc0, vc0 = kc.clone(), vc.clone()
    ops.check_errors()
    out = ops.decode_attention(q, kn, vn, kc, vc, torch.tensor([4, 40], dtype=torch.int32, device=DEV))
    torch.cuda.synchronize()
    assert torch.isnan(out.float()).all()
    assert torch.equal(kc, kc0) and torch.equal(vc, vc0)
    with pytest.raises(tileweave.InvalidArgument, match=r"seq_lens\[1\] = 40 is outside \[1, 32\]"):
        ops.check_errors()
    ops.check_errors()  # reported once
    pc, pv = randn(6, 2, 16, 64), randn(6, 2, 16, 64)
    out = ops.decode_attention(q, kn, vn, pc, pv, torch.tensor([4, 20], device=DEV),
                               page_table=torch.tensor([[0, 1], [2, -3]], device=DEV))
    with pytest.raises(tileweave.InvalidArgument, match=r"page_table\[1\]\[1\] = -3 is outside \[0, 6\)"):
        ops.check_errors()
    assert torch.isnan(out.float()).all()
    # A good call on the same plan afterwards computes normally.
    out = ops.decode_attention(q, kn, vn, kc, vc, torch.tensor([4, 30], dtype=torch.int32, device=DEV))
    assert torch.isfinite(out.float()).all()
