#!/usr/bin/env python3
"""PyTorch peer of slipstream's behaviour-cloning model: melee_embedding -> mamba (or gru) ->
controller_heads -> bc_loss, written the way a competent PyTorch user would (nn.Module classes,
mamba-ssm's parameter names, the sequential `selective_scan_ref` loop), so that slipstream's
training step can be timed against an honest eager / torch.compile baseline on the same graph.

Its sizes and hyper-parameters come from a reference directory written by

    build/bin/slipstream reference-step --out /tmp/ref [--set stage.param=value ...]

which holds graph.json (stages, resolved params, the step's metrics), batch.safetensors (the
first training batch), model.safetensors (the starting weights, "<stage>.<param>") and
grads.safetensors (every weight's gradient after that step's backward).

    python3 bench/peers/bc_model_torch.py --check /tmp/ref
    python3 bench/peers/bc_model_torch.py --bench /tmp/ref --steps 20 --warmup 3 --threads 2 \\
        [--mode eager|compile|compile-regions] [--precision fp32|bf16] [--device cpu|cuda] \\
        [--json OUT.json]

--check builds the model in float64 and float32, runs one forward + loss + backward on the
reference batch from the reference weights and compares the loss and every gradient with
slipstream's; it exits non-zero when they differ beyond the printed tolerances (1 on a
mismatch). With a compile mode it also checks the float32 step compiled that way. The --bench
figures mean nothing unless --check passes for the same directory: a faster model that computes
something else is not a peer.

Two ways to compile, both what PyTorch users do: `compile` hands the whole forward and loss to
torch.compile (one graph: the scan loop unrolled for every layer, so compiling takes minutes on a
GPU); `compile-regions` is PyTorch's regional compilation, which compiles each repeated block
once (every layer reuses that graph) and the embedding, the heads and the loss as graphs of
their own: a half to three quarters of the compile time at two layers on the CPU (less with
more layers), fusion stopping at the regions' edges.

--bench repeats the reference batch through a full training step (forward, loss, backward,
gradient clipping, torch.optim.AdamW with the adamw stage's lr/betas/eps/weight decay) and
reports the median and p90 step time and the derived steps/s, samples/s and frames/s.
On the CPU, time it with glibc's malloc tuned as side_by_side.py does (its MALLOC_ENV, through
GLIBC_TUNABLES): as is, glibc makes the eager step page-fault through fresh memory, about 5x
slower at cpu_large.

`--scan fused` runs each Mamba layer as mamba-ssm's fast path does (`mamba_simple.Mamba.forward`:
the in_proj GEMM, then `mamba_inner_fn` — causal-conv1d's fused conv + SiLU, the x/dt projections,
`selective_scan_fn` with the delta bias and softplus inside, the gate and out_proj — from the
bundle bench/peers/build_mamba_ssm.sh builds, on PYTHONPATH): what people who train Mamba in
PyTorch run. Its kernels have no float64 form: --check then compares the float64 loop and the
float32 fused step with slipstream's. `--perturb` scales the D skip by 1 + 1e-3 in the fused path:
a small real difference that --check must report as a failure (proof that its tolerance, loose
enough for fast math and the kernels' other rounding, still sees one).

`--mode graph` (CUDA) captures the whole training step — forward, loss, backward, clipping and
AdamW (capturable) — as one CUDA graph after a few warm-up steps and replays it: the fewest
launches PyTorch can give the step, as our step replays its own graph.

Dependencies: torch, numpy, safetensors (and mamba-ssm's bundle for --scan fused).
"""
import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def load_file(path):
    # Imported here so selective_scan_torch.py can borrow the scan where safetensors is missing.
    from safetensors.torch import load_file as load

    return load(path)

# ---------------------------------------------------------------- batch layout
# stages/melee/batch_layout.h: the loader's tensors and the embedding's normalisation.

N_ACTION_STATES = 399
N_CHARACTERS = 33
N_STAGES = 64
N_SLOTS = 3  # player, opponent, the player's Nana
N_NUMERIC = 18
EXISTS = 17  # numeric feature: 1 when the slot has a character this frame
N_CONTROLLER = 13  # 8 buttons, main x/y, c x/y, shoulder
N_PREV_CLASSES = 4 * 17 + 5  # the previous input's stick and shoulder classes, one-hot
NUMERIC_SCALE = [
    0.01,  # percent
    1.0,  # facing
    0.05,  # x
    0.05,  # y
    0.01,  # shield
    1.0,  # jumps left
    1.0,  # on ground
    1.0,  # invulnerable
    0.1,  # hitlag
    0.02,  # hitstun
    0.01,  # action frame
    0.5, 0.5, 0.5, 0.5, 0.5,  # the five speeds
    0.25,  # stocks
    1.0,  # exists
]
# The six heads in bc_loss's order (head_weights follow it); buttons are 8 independent BCEs.
HEADS = [("buttons", 8), ("main_x", 17), ("main_y", 17), ("c_x", 17), ("c_y", 17), ("shoulder", 5)]

BATCH_PORTS = ["numeric", "action", "character", "stage", "prev_controller", "target_buttons",
               "target_sticks", "mask"]
INDEX_PORTS = {"action", "character", "stage", "target_sticks"}


# Where the peer runs (--device): the model, the batch and the step. "cuda" times it on the GPU
# (TF32 off, so fp32 means fp32 as on our side).
DEVICE = torch.device("cpu")
SCAN = "loop"  # --scan: the sequential reference loop, or mamba-ssm's fused path
PERTURB = False  # --perturb: the fused path's D scaled by 1 + 1e-3


# ---------------------------------------------------------------- model

def prev_classes_one_hot(prev_controller):
    """The previous input in the heads' terms: each stick axis's class (17 bins over [-1, 1]) and
    the shoulder's (5 over [0, 1]), one-hot, in head order: (..., 73). torch.round rounds half
    to even, as slipstream's nearbyint."""
    sticks = torch.round((prev_controller[..., 8:12].clamp(-1, 1) + 1) * 0.5 * 16).long()
    shoulder = torch.round(prev_controller[..., 12].clamp(0, 1) * 4).long()
    parts = [F.one_hot(sticks[..., h], 17) for h in range(4)] + [F.one_hot(shoulder, 5)]
    return torch.cat(parts, dim=-1).to(prev_controller.dtype)


class MeleeEmbedding(nn.Module):
    """Game state -> one feature vector per frame (docs/melee_features.md).

    Columns per slot: numeric * NUMERIC_SCALE | action embedding | character embedding; then the
    stage embedding, the previous controller, its stick and shoulder classes one-hot (with
    prev_classes), zero padding to a multiple of 8.
    """

    def __init__(self, action_dim, character_dim, stage_dim, prev_classes=True):
        super().__init__()
        self.action_table = nn.Embedding(N_ACTION_STATES, action_dim)
        self.character_table = nn.Embedding(N_CHARACTERS, character_dim)
        self.stage_table = nn.Embedding(N_STAGES, stage_dim)
        self.register_buffer("numeric_scale", torch.tensor(NUMERIC_SCALE), persistent=False)
        self.prev_classes = prev_classes
        self.controller_offset = N_SLOTS * (N_NUMERIC + action_dim + character_dim) + stage_dim
        self.prev_width = N_CONTROLLER + (N_PREV_CLASSES if prev_classes else 0)
        raw = self.controller_offset + self.prev_width
        self.width = (raw + 7) // 8 * 8
        self.pad = self.width - raw

    def forward(self, numeric, action, character, stage, prev_controller):
        # An absent slot (Nana for everyone but Ice Climbers) gets zero embeddings rather than
        # row 0 of the tables; multiplying by the flag also keeps its rows out of the gradient.
        exists = (numeric[..., EXISTS] > 0.5).unsqueeze(-1).to(numeric.dtype)
        slots = torch.cat([numeric * self.numeric_scale,
                           self.action_table(action) * exists,
                           self.character_table(character) * exists], dim=-1)  # (B, W, 3, slot)
        parts = [slots.flatten(2), self.stage_table(stage), prev_controller]
        if self.prev_classes:
            parts.append(prev_classes_one_hot(prev_controller))
        return F.pad(torch.cat(parts, dim=-1), (0, self.pad))


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def no_autocast():
    # Under --precision bf16 only the Linear GEMMs run in bf16 (slipstream's bf16 policy, except
    # that slipstream keeps dt_proj, a rank-d_model/16 product, in fp32; here it runs in bf16 as
    # under mamba-ssm's autocast); the conv, the scan and the loss stay in the parameters'
    # precision.
    return torch.autocast(DEVICE.type, enabled=False)


def selective_scan_ref(u, delta, A, B, C, D, z, delta_bias):
    """mamba-ssm's selective_scan_ref (real A, variable B/C, delta_softplus=True), without its
    float casts so the float64 check stays float64.

    u, delta, z: (batch, dim, L); A: (dim, N); B, C: (batch, N, L); D, delta_bias: (dim).
    """
    delta = F.softplus(delta + delta_bias[..., None])  # threshold 20, as the C++ kernel
    batch, dim, L = u.shape
    x = u.new_zeros((batch, dim, A.shape[1]))
    deltaA = torch.exp(torch.einsum("bdl,dn->bdln", delta, A))
    deltaB_u = torch.einsum("bdl,bnl,bdl->bdln", delta, B, u)
    ys = []
    for i in range(L):
        x = deltaA[:, :, i] * x + deltaB_u[:, :, i]
        ys.append(torch.einsum("bdn,bn->bd", x, C[:, :, i]))
    y = torch.stack(ys, dim=2) + u * D[..., None]
    return y * F.silu(z)


class Mamba(nn.Module):
    """Mamba-1 mixer, mamba-ssm's names and its slow (non-fused) forward path."""

    def __init__(self, d_model, d_state, d_conv, expand, dt_rank):
        super().__init__()
        self.d_inner = expand * d_model
        self.d_state = d_state
        self.dt_rank = dt_rank if dt_rank > 0 else math.ceil(d_model / 16)
        self.in_proj = nn.Linear(d_model, 2 * self.d_inner, bias=False)
        self.conv1d = nn.Conv1d(self.d_inner, self.d_inner, d_conv, groups=self.d_inner,
                                padding=d_conv - 1, bias=True)
        self.x_proj = nn.Linear(self.d_inner, self.dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, self.d_inner, bias=True)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1.0)).repeat(self.d_inner, 1))
        self.D = nn.Parameter(torch.ones(self.d_inner))
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=False)

    def forward(self, h):  # (B, L, d_model)
        if SCAN == "fused" and h.dtype != torch.float64:
            return self.forward_fused(h)
        L = h.shape[1]
        wt = self.A_log.dtype  # the parameters' precision (float32 or float64)
        x, z = self.in_proj(h).transpose(1, 2).chunk(2, dim=1)  # (B, d_inner, L) each
        with no_autocast():
            # Causal: pad K-1 on both sides, keep the first L outputs.
            x = F.silu(self.conv1d(x.to(wt))[..., :L])
        dt, B, C = torch.split(self.x_proj(x.transpose(1, 2)),
                               [self.dt_rank, self.d_state, self.d_state], dim=-1)
        # dt_proj's bias is not added here: the scan adds it (delta_bias) before the softplus.
        dt = F.linear(dt, self.dt_proj.weight).transpose(1, 2)
        with no_autocast():
            A = -torch.exp(self.A_log)
            y = selective_scan_ref(x, dt.to(wt), A, B.transpose(1, 2).to(wt),
                                   C.transpose(1, 2).to(wt), self.D, z.to(wt), self.dt_proj.bias)
        return self.out_proj(y.transpose(1, 2))

    def forward_fused(self, h):
        """mamba_simple.Mamba.forward's fast path (no inference cache)."""
        from mamba_ssm.ops.selective_scan_interface import mamba_inner_fn
        batch, L, d = h.shape
        # The in_proj GEMM writes (d, batch*L): viewed as (batch, 2*d_inner, L) without a copy.
        xz = (self.in_proj.weight @ h.reshape(batch * L, d).t()).view(-1, batch, L)
        xz = xz.permute(1, 0, 2)
        A = -torch.exp(self.A_log.float())
        D = self.D.float() * (1 + 1e-3) if PERTURB else self.D.float()
        return mamba_inner_fn(xz, self.conv1d.weight, self.conv1d.bias, self.x_proj.weight,
                              self.dt_proj.weight, self.out_proj.weight, self.out_proj.bias, A,
                              None, None, D, delta_bias=self.dt_proj.bias.float(),
                              delta_softplus=True)


class Block(nn.Module):
    """Pre-norm residual block: h + Mixer(RMSNorm(h))."""

    def __init__(self, d_model, eps, **mixer):
        super().__init__()
        self.norm = RMSNorm(d_model, eps)
        self.mixer = Mamba(d_model, **mixer)

    def forward(self, h):
        return h + self.mixer(self.norm(h))


class MambaCore(nn.Module):
    """mamba-ssm's MixerModel without its embedding; an input projection maps the embedding
    width to d_model when they differ; a final RMSNorm."""

    def __init__(self, din, d_model, d_state, d_conv, expand, dt_rank, layers, eps):
        super().__init__()
        self.input_proj = nn.Linear(din, d_model) if din != d_model else None
        self.layers = nn.ModuleList(
            Block(d_model, eps, d_state=d_state, d_conv=d_conv, expand=expand, dt_rank=dt_rank)
            for _ in range(layers))
        self.norm_f = RMSNorm(d_model, eps)
        self.d_out = d_model

    def forward(self, x):
        h = self.input_proj(x) if self.input_proj is not None else x
        for layer in self.layers:
            h = layer(h)
        return self.norm_f(h)


class GruCore(nn.Module):
    """The `gru` stage: PyTorch's nn.GRU (batch_first, zero initial state); its parameters sit
    directly under the stage (weight_ih_l0, ...), hence the subclass rather than a member."""

    def __init__(self, din, hidden, layers):
        super().__init__()
        self.gru = nn.GRU(din, hidden, layers, batch_first=True)
        self.d_out = hidden

    def forward(self, x):
        return self.gru(x)[0]

    # Present the GRU's parameters without the "gru." prefix, as the checkpoint names them.
    def load_stage_state(self, sd):
        self.gru.load_state_dict(sd, strict=True)

    def stage_parameters(self):
        return list(self.gru.named_parameters())


class ControllerHeads(nn.Module):
    """Six linear heads (optionally after a shared SiLU layer); names as the checkpoint's. With
    prev_width > 0 (the heads' prev_input connected), a direct linear path (no bias) from the
    previous-input columns of the embedding to all 81 logits, split by head."""

    def __init__(self, d_in, hidden, prev_width=0):
        super().__init__()
        self.hidden = nn.Linear(d_in, hidden) if hidden > 0 else None
        width = hidden if hidden > 0 else d_in
        for name, k in HEADS:
            setattr(self, name, nn.Linear(width, k))
        self.prev = nn.Linear(prev_width, sum(k for _, k in HEADS), bias=False) if prev_width else None

    def forward(self, x, prev=None):
        if self.hidden is not None:
            x = F.silu(self.hidden(x))
        out = {name: getattr(self, name)(x) for name, _ in HEADS}
        if self.prev is not None:
            direct = self.prev(prev).split([k for _, k in HEADS], dim=-1)
            out = {name: out[name] + d for (name, _), d in zip(HEADS, direct)}
        return out


class BCModel(nn.Module):
    def __init__(self, embed, core, heads):
        super().__init__()
        self.embed, self.core, self.heads = embed, core, heads

    def forward(self, b):
        x = self.embed(b["numeric"], b["action"], b["character"], b["stage"],
                       b["prev_controller"])
        e = self.embed
        prev = x[..., e.controller_offset:e.controller_offset + e.prev_width]
        return self.heads(self.core(x), prev)


# ---------------------------------------------------------------- loss

def bc_loss(logits, b, head_weights, eps, metrics=False):
    """slipstream's bc_loss (stages/melee/model_math.h):
    loss = sum_h w_h * sum_i mask_i * l_hi / sum_i mask_i over positions with mask > 0,
    l_buttons = BCE-with-logits summed over the 8 buttons (labels smoothed to y(1-eps)+eps/2),
    l_stick = softmax cross-entropy with label smoothing eps. Returns (loss, metrics or None)."""
    mask = b["mask"]
    w = torch.where(mask > 0, mask, torch.zeros_like(mask))  # (B, W)
    # No valid position: the sums are 0 and so is the loss (slipstream's convention); tiny
    # keeps the division exact for every positive sum without a host sync.
    denom = w.sum().clamp_min(torch.finfo(w.dtype).tiny)
    valid = w > 0

    def head_losses(e):
        out = []
        x = logits["buttons"].to(w.dtype)
        y = b["target_buttons"] * (1 - e) + e / 2
        per = F.binary_cross_entropy_with_logits(x, y, reduction="none").sum(-1)
        out.append((torch.where(valid, per, 0) * w).sum() / denom)
        for h, (name, k) in enumerate(HEADS[1:]):
            x = logits[name].to(w.dtype)
            # Masked positions may hold any label: clamp it, then weigh them out.
            tgt = b["target_sticks"][..., h].clamp(0, k - 1)
            ce = F.cross_entropy(x.flatten(0, 1), tgt.flatten(), reduction="none",
                                 label_smoothing=e).view_as(w)
            out.append((torch.where(valid, ce, 0) * w).sum() / denom)
        return out

    losses = head_losses(eps)
    total = sum(hw * l for hw, l in zip(head_weights, losses))
    if not metrics:
        return total, None
    with torch.no_grad():
        nlls = head_losses(0.0) if eps != 0 else losses
        m = {"loss": total.item(), "nll": sum(hw * l for hw, l in zip(head_weights, nlls)).item()}
        n = w.sum()
        for (name, k), l, nl in zip(HEADS, losses, nlls):
            m["loss/" + name], m["nll/" + name] = l.item(), nl.item()
            x = logits[name].to(w.dtype)
            if name == "buttons":  # per-button mean accuracy: right when (logit > 0) == pressed
                right = ((x > 0) == (b["target_buttons"] > 0.5)).to(w.dtype).mean(-1)
            else:
                h = [hn for hn, _ in HEADS[1:]].index(name)
                right = (x.argmax(-1) == b["target_sticks"][..., h]).to(w.dtype)
            m["acc/" + name] = ((right * w).sum() / n).item() if n > 0 else 0.0
    return total, m


def check_labels(b):
    """bc_loss rejects a class out of range at a valid position; so do we (before any work)."""
    valid = b["mask"] > 0
    for h, (name, k) in enumerate(HEADS[1:]):
        t = b["target_sticks"][..., h][valid]
        if t.numel() and (t.min() < 0 or t.max() >= k):
            raise ValueError(f"target_sticks: head {name} has a class outside [0, {k}) at a "
                             "valid position")


# ---------------------------------------------------------------- the reference directory

class Reference:
    """graph.json, batch, weights and gradients of one `slipstream reference-step` directory."""

    def __init__(self, path):
        self.dir = Path(path)
        with open(self.dir / "graph.json") as f:
            self.graph = json.load(f)
        self.metrics = self.graph.get("metrics", {})
        self.stages = self.graph["stages"]

    def stage(self, *kinds, required=True):
        found = [s for s in self.stages if s["kind"] in kinds]
        if len(found) > 1:
            raise SystemExit(f"graph.json has {len(found)} stages of kind {kinds}; the peer "
                             "models the single-chain BC graph only")
        if not found:
            if required:
                raise SystemExit(f"graph.json has no stage of kind {' or '.join(kinds)}")
            return None
        return found[0]

    def batch(self, dtype):
        src = self.stage("slippi_replays")["name"]
        raw = load_file(str(self.dir / "batch.safetensors"))
        b = {}
        for port in BATCH_PORTS:
            t = raw[f"{src}.{port}"]
            b[port] = (t.long() if port in INDEX_PORTS else t.to(dtype)).to(DEVICE)
        return b

    def weights(self, which="model"):
        return load_file(str(self.dir / f"{which}.safetensors"))


def build_model(ref):
    """The model graph.json describes; returns (model, {graph stage name: submodule})."""
    ep = ref.stage("melee_embedding")
    cp = ref.stage("mamba", "gru")
    hp = ref.stage("controller_heads")
    p = ep["params"]
    embed = MeleeEmbedding(p["action_dim"], p["character_dim"], p["stage_dim"],
                           p.get("prev_classes", False))
    c = cp["params"]
    if cp["kind"] == "mamba":
        core = MambaCore(embed.width, c["d_model"], c["d_state"], c["d_conv"], c["expand"],
                         c["dt_rank"], c["layers"], c["eps"])
    else:
        core = GruCore(embed.width, c["hidden"], c["layers"])
    direct = "prev_input" in (hp.get("inputs") or {})  # the heads' direct path is wired
    heads = ControllerHeads(core.d_out, hp["params"]["hidden"], embed.prev_width if direct else 0)
    model = BCModel(embed, core, heads)
    return model, {ep["name"]: embed, cp["name"]: core, hp["name"]: heads}


def stage_params(mod):
    if hasattr(mod, "stage_parameters"):
        return mod.stage_parameters()
    return list(mod.named_parameters())


def load_weights(parts, weights):
    """Strips "<stage>." and loads each stage's weights into its submodule (strict)."""
    for stage, mod in parts.items():
        sd = {k[len(stage) + 1:]: v for k, v in weights.items() if k.startswith(stage + ".")}
        if hasattr(mod, "load_stage_state"):
            mod.load_stage_state(sd)
        else:
            mod.load_state_dict(sd, strict=True)
    ours = {f"{s}.{n}" for s, m in parts.items() for n, _ in stage_params(m)}
    extra = sorted(set(weights) - ours)
    if extra:
        raise SystemExit(f"model.safetensors has weights no modelled stage takes: {extra}")


def loss_settings(ref):
    p = ref.stage("bc_loss")["params"]
    hw = [float(v) for v in p.get("head_weights", [1.0] * len(HEADS))]
    if len(hw) != len(HEADS):
        raise SystemExit(f"bc_loss head_weights has {len(hw)} values, needs {len(HEADS)}")
    return hw, float(p.get("label_smoothing", 0.0))


def refuse_augmentation(ref):
    # The embedding's training-time mirroring and noise are drawn from the run's seed, which
    # the reference directory does not carry: such a step cannot be reproduced here.
    p = ref.stage("melee_embedding")["params"]
    if p.get("mirror") or p.get("noise", 0.0) > 0:
        raise SystemExit("the reference was made with melee_embedding mirror/noise on; its "
                         "random draws cannot be reproduced: make it with mirror=false noise=0")


# ---------------------------------------------------------------- --check

# Pass criteria. Gradients are compared relative to the tensor's largest magnitude (an
# element-wise ratio is meaningless where a gradient is near zero by cancellation).
TOL = {
    torch.float64: {"loss": 2e-6, "grad": 2e-5},  # only slipstream's fp32 rounding remains
    torch.float32: {"loss": 1e-5, "grad": 1e-4},  # both sides' fp32 rounding
}


COMPILE_MODES = ("compile", "compile-regions")


def compile_regions(model):
    """PyTorch's regional compilation, in place: each of the core's blocks (one compiled graph
    that every layer reuses: same code, parameters as inputs), the embedding and the heads."""
    model.embed.compile()
    model.heads.compile()
    for block in getattr(model.core, "layers", []):
        block.compile()


def compiled_forward_loss(model, head_weights, eps, mode, autocast=contextlib.nullcontext):
    """batch -> loss of the forward under `mode`; the loss without the metrics, whose .item()
    calls would break the graph."""
    def loss(logits, batch):
        return bc_loss(logits, batch, head_weights, eps)[0]

    if mode == "compile-regions":
        compile_regions(model)
        loss = torch.compile(loss)

    def forward_loss(batch):
        with autocast():
            logits = model(batch)
        return loss(logits, batch)

    return torch.compile(forward_loss) if mode == "compile" else forward_loss


def one_step(model, parts, b, head_weights, eps, mode="eager"):
    model.zero_grad(set_to_none=True)
    if mode in COMPILE_MODES:
        loss = compiled_forward_loss(model, head_weights, eps, mode)(b)
        # The metrics from an eager forward of the same weights (compile-regions has compiled
        # the modules in place: their forward here without grad compiles again, for the check).
        with torch.no_grad():
            m = bc_loss(model(b), b, head_weights, eps, metrics=True)[1]
        m["loss"] = loss.item()
    else:
        logits = model(b)
        loss, m = bc_loss(logits, b, head_weights, eps, metrics=True)
    loss.backward()
    grads = {}
    for stage, mod in parts.items():
        for n, p in stage_params(mod):
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            grads[f"{stage}.{n}"] = g.detach().cpu()
    return loss.item(), m, grads


def compare(grads, ref_grads):
    rows = []
    for name, r in ref_grads.items():
        if name not in grads:
            rows.append((math.inf, name, tuple(r.shape), 0.0, math.inf, math.inf))
            continue
        g = grads[name].double()
        r = r.double()
        if g.shape != r.shape:
            rows.append((math.inf, name, tuple(r.shape), 0.0, math.inf, math.inf))
            continue
        diff = (g - r).abs()
        scale = r.abs().max().item()
        mad = diff.max().item()
        rel = mad / scale if scale > 0 else (0.0 if mad == 0 else math.inf)
        big = r.abs() > 1e-3 * scale  # element-wise relative diff where it means something
        erel = (diff[big] / r.abs()[big]).max().item() if scale > 0 and big.any() else 0.0
        rows.append((rel, name, tuple(r.shape), scale, mad, erel))
    for name in sorted(set(grads) - set(ref_grads)):
        rows.append((math.inf, name + " (missing in grads.safetensors)", (), 0.0, math.inf,
                     math.inf))
    rows.sort(key=lambda x: -x[0])
    return rows


def run_check(ref, mode="eager"):
    refuse_augmentation(ref)
    head_weights, eps = loss_settings(ref)
    ref_loss = ref.metrics.get("loss")
    if ref_loss is None:
        raise SystemExit("graph.json has no metrics.loss")
    weights, ref_grads = ref.weights("model"), ref.weights("grads")
    core = ref.stage("mamba", "gru")
    print(f"reference {ref.dir}: core {core['kind']} {core['params']}, heads "
          f"{ref.stage('controller_heads')['params']}, label_smoothing {eps}, head_weights "
          f"{head_weights}")
    ok = True
    results = {}
    f32 = "float32 fused" if SCAN == "fused" else "float32"
    passes = [("float64", torch.float64, "eager"), (f32, torch.float32, "eager")]
    if mode in COMPILE_MODES:
        passes.append((f"float32 {mode}", torch.float32, mode))
    for name, dtype, comp in passes:
        tol = TOL[dtype]
        model, parts = build_model(ref)
        load_weights(parts, weights)
        model.to(device=DEVICE, dtype=dtype)
        b = ref.batch(dtype)
        check_labels(b)
        try:
            loss, m, grads = one_step(model, parts, b, head_weights, eps, mode=comp)
        except Exception as e:  # noqa: BLE001 - report like --bench does
            if comp == "eager":
                raise
            print(f"torch.compile failed: {type(e).__name__}: {e}", file=sys.stderr)
            return 3
        if comp == "eager":
            results[dtype] = (loss, grads)
        dl = abs(loss - ref_loss)
        rl = dl / abs(ref_loss)
        print(f"\n== {name}: loss ours {loss:.10f}  slipstream {ref_loss:.10f}  abs diff "
              f"{dl:.3e}  rel {rl:.3e}  (pass: rel <= {tol['loss']:.0e})")
        for k in sorted(m):
            if k != "loss" and k in ref.metrics:
                print(f"   {k:16s} ours {m[k]:.8f}  slipstream {ref.metrics[k]:.8f}  "
                      f"diff {m[k] - ref.metrics[k]:+.2e}")
        rows = compare(grads, ref_grads)
        print(f"   gradients, worst first (pass: max|diff| / max|ref| <= {tol['grad']:.0e}; "
              "elem rel is over |ref| > 1e-3 max|ref|):")
        print(f"   {'tensor':44s} {'shape':16s} {'max|ref|':>10s} {'max|diff|':>10s} "
              f"{'rel/max':>10s} {'elem rel':>10s}")
        bad = [r for r in rows if not r[0] <= tol["grad"]]
        for rel, n, shape, scale, mad, erel in rows:
            flag = "  FAIL" if not rel <= tol["grad"] else ""
            print(f"   {n:44s} {str(shape):16s} {scale:10.3e} {mad:10.3e} {rel:10.3e} "
                  f"{erel:10.3e}{flag}")
        passed = rl <= tol["loss"] and not bad
        print(f"   {name}: {'PASS' if passed else 'FAIL'}")
        ok = ok and passed
    # Our own two precisions against each other: a large gap with both passing would mean the
    # tolerances are too loose to say anything.
    l64, g64 = results[torch.float64]
    l32, g32 = results[torch.float32]
    worst = max(compare(g32, {k: v.float() for k, v in g64.items()}), key=lambda r: r[0])
    print(f"\nours fp32 vs ours fp64: loss rel {abs(l32 - l64) / abs(l64):.3e}, worst gradient "
          f"{worst[1]} rel/max {worst[0]:.3e}")
    print(f"\ncheck {'PASSED' if ok else 'FAILED'}")
    return 0 if ok else 1


# ---------------------------------------------------------------- --bench

def make_optimizer(model, ref, capturable=False):
    """torch.optim.AdamW with the adamw stage's settings. Weight decay on Linear and Conv1d
    weights only (slipstream: none on tables, norms, biases, A_log, D). The lr schedule is not
    reproduced: its cost is nil and it does not change the step's work."""
    p = (ref.stage("adamw", required=False) or {"params": {}})["params"]
    decay, no_decay = [], []
    for mod in model.modules():
        for n, prm in mod.named_parameters(recurse=False):
            is_w = n == "weight" and isinstance(mod, (nn.Linear, nn.Conv1d))
            is_w = is_w or (isinstance(mod, nn.GRU) and n.startswith("weight_"))
            (decay if is_w else no_decay).append(prm)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": float(p.get("weight_decay", 0.01))},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=float(p.get("lr", 1e-4)), betas=(float(p.get("beta1", 0.9)), float(p.get("beta2", 0.999))),
        eps=float(p.get("eps", 1e-8)), capturable=capturable)
    return opt, float(p.get("clip", 1.0))


def run_bench(ref, args):
    torch.set_num_threads(args.threads)
    refuse_augmentation(ref)
    head_weights, eps = loss_settings(ref)
    model, parts = build_model(ref)
    load_weights(parts, ref.weights("model"))
    model.to(DEVICE)
    b = ref.batch(torch.float32)
    check_labels(b)
    B, W = b["mask"].shape
    graph = args.mode == "graph"
    if graph and DEVICE.type != "cuda":
        raise SystemExit("--mode graph captures a CUDA graph: it needs --device cuda")
    opt, clip = make_optimizer(model, ref, capturable=graph)
    params = [p for p in model.parameters()]
    bf16 = args.precision == "bf16"

    def autocast():
        # A captured graph cannot use autocast's cache of cast weights (PyTorch's advice).
        return (torch.autocast(DEVICE.type, dtype=torch.bfloat16, cache_enabled=not graph)
                if bf16 else contextlib.nullcontext())

    compile_error = None
    try:
        forward_loss = compiled_forward_loss(model, head_weights, eps,
                                             "eager" if graph else args.mode, autocast)
    except Exception as e:  # noqa: BLE001 - any failure means no compiled figure
        compile_error = e

    # A step is one optimizer update, as ours is: under the adamw stage's `accumulate` (production:
    # 4) that is that many forward and backward passes (of the one reference batch) first.
    adamw = ref.stage("adamw", required=False) or {"params": {}}
    accumulate = int(adamw["params"].get("accumulate", 1))

    def eager_step(zero=True):
        if zero:
            opt.zero_grad(set_to_none=True)
        for _ in range(accumulate):
            loss = forward_loss(b)
            (loss / accumulate if accumulate > 1 else loss).backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        return loss

    step = eager_step
    if graph:
        # PyTorch's whole-network capture: warm-up steps on a side stream, then one step
        # captured; each later step replays it (the batch stays at its addresses).
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                eager_step()
        torch.cuda.current_stream().wait_stream(side)
        captured = torch.cuda.CUDAGraph()
        # Gradients set to None first: the captured backward allocates them in the graph's pool.
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(captured):
            graph_loss = eager_step(zero=False)

        def step():
            captured.replay()
            return graph_loss

    times, first_loss = [], None
    t_warm = time.perf_counter()
    # On a GPU a step is timed from an idle device to the end of its work.
    sync = torch.cuda.synchronize if DEVICE.type == "cuda" else (lambda: None)
    for i in range(args.warmup + args.steps):
        sync()
        t0 = time.perf_counter()
        try:
            loss = step()
            sync()
        except Exception as e:  # noqa: BLE001
            if args.mode in ("eager", "graph"):
                raise
            compile_error = e
        if compile_error is not None:
            print(f"torch.compile failed: {type(compile_error).__name__}: {compile_error}",
                  file=sys.stderr)
            return 3
        t1 = time.perf_counter()
        if i == 0:
            first_loss = loss.item()  # from the reference weights: must equal slipstream's
            first_step_s = t1 - t0  # under a compile mode, the compile (from the caches if warm)
        if i == args.warmup - 1:
            warmup_s = t1 - t_warm
        if i >= args.warmup:
            times.append((t1 - t0) * 1e3)
    if args.warmup == 0:
        warmup_s = 0.0

    med = float(np.median(times))
    p90 = float(np.percentile(times, 90))
    ref_loss = ref.metrics.get("loss")
    core = ref.stage("mamba", "gru")
    res = {
        "peer": "pytorch",
        "torch": torch.__version__,
        "reference": str(ref.dir),
        "mode": args.mode,
        "scan": SCAN,
        "device": str(DEVICE),
        "precision": args.precision,
        "threads": args.threads,
        "steps": args.steps,
        "warmup": args.warmup,
        "batch": B,
        "accumulate": accumulate,
        "window": W,
        "core": {"kind": core["kind"], **core["params"]},
        "heads_hidden": ref.stage("controller_heads")["params"]["hidden"],
        "parameters": sum(p.numel() for p in params),
        "step_ms_median": med,
        "step_ms_p90": p90,
        "step_ms_min": float(np.min(times)),
        "steps_per_s": 1e3 / med,
        "samples_per_s": B * accumulate * 1e3 / med,
        "frames_per_s": B * accumulate * W * 1e3 / med,
        "warmup_s": warmup_s,
        "first_step_s": first_step_s,
        "first_loss": first_loss,
        "reference_loss": ref_loss,
    }
    print(f"bc_model_torch {args.mode} {args.precision} on {DEVICE}, {args.threads} threads, "
          f"B {B} W {W}" + (f" x{accumulate} batches a step" if accumulate > 1 else "") + ", "
          f"{core['kind']} {core['params']}")
    if ref_loss is not None:
        print(f"first step loss {first_loss:.8f} vs slipstream {ref_loss:.8f} (rel diff "
              f"{abs(first_loss - ref_loss) / abs(ref_loss):.2e}; a sanity check only, "
              "--check is the test)")
    print(f"warm-up {args.warmup} steps: {warmup_s:.2f} s (the first {first_step_s:.2f} s)")
    print(f"step median {med:.2f} ms, p90 {p90:.2f} ms over {args.steps} steps: "
          f"{res['steps_per_s']:.2f} steps/s, {res['samples_per_s']:.1f} samples/s, "
          f"{res['frames_per_s']:.0f} frames/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
            f.write("\n")
    return 0


def main():
    ap = argparse.ArgumentParser(
        description="PyTorch peer of slipstream's behaviour-cloning model: check it against a "
        "reference step, then time its training step.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--check", metavar="DIR", help="compare loss and gradients with DIR's")
    what.add_argument("--bench", metavar="DIR", help="time training steps on DIR's batch")
    ap.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(),
                    help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--mode", choices=["eager", "graph", *COMPILE_MODES], default="eager",
                    help="compile: torch.compile the forward + loss as one graph; "
                    "compile-regions: each block, the embedding, the heads and the loss on their "
                    "own (exit 3 if compiling fails); with --check, also check the compiled step; "
                    "graph: the whole eager step captured as one CUDA graph and replayed")
    ap.add_argument("--scan", choices=["loop", "fused"], default="loop",
                    help="loop: mamba-ssm's sequential reference scan; fused: mamba-ssm's fast "
                    "path (mamba_inner_fn, causal_conv1d_fn), CUDA only")
    ap.add_argument("--perturb", action="store_true",
                    help="with --scan fused: scale D by 1 + 1e-3 (--check must then fail)")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--json", metavar="OUT", help="write the bench results here")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="where the peer runs (cuda: the first GPU, TF32 off)")
    args = ap.parse_args()
    global DEVICE, SCAN, PERTURB
    DEVICE = torch.device(args.device)
    SCAN, PERTURB = args.scan, args.perturb
    if SCAN == "fused" and DEVICE.type != "cuda":
        ap.error("--scan fused: mamba-ssm's kernels run on CUDA only")
    if DEVICE.type == "cuda":
        if not torch.cuda.is_available():
            ap.error("--device cuda: this PyTorch sees no GPU")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    if args.check:
        return run_check(Reference(args.check), mode=args.mode)
    if args.steps < 1 or args.warmup < 0 or args.threads < 1:
        ap.error("--steps and --threads must be >= 1, --warmup >= 0")
    return run_bench(Reference(args.bench), args)


if __name__ == "__main__":
    sys.exit(main())
