"""A small causal language model of Mamba-3 blocks, with cache-based ``generate()``.

Layout and parameter names follow ``mamba_ssm.models.mixer_seq_simple.MambaLMHeadModel`` (backbone.embedding,
backbone.layers.{i}.{norm, mixer, norm2, mlp.fc1, mlp.fc2}, backbone.norm_f, lm_head tied to the embedding):
pre-norm residual blocks h ← h + mixer(norm(h)) and, with d_intermediate > 0, h ← h + mlp(norm2(h)).
"""
from __future__ import annotations

import math
from collections import namedtuple
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .cache import InferenceParams
from .mamba3_layer import Mamba3
from .norms import RMSNorm

CausalLMOutput = namedtuple("CausalLMOutput", ["logits"])


@dataclass
class Mamba3Config:
    d_model: int = 256
    n_layer: int = 4
    vocab_size: int = 256
    d_intermediate: int = 0          # gated MLP width after each mixer (0 = no MLP)
    ssm_cfg: dict = field(default_factory=dict)   # Mamba3 constructor arguments (d_state, headdim, is_mimo, …)
    norm_epsilon: float = 1e-5
    tie_embeddings: bool = True
    pad_vocab_size_multiple: int = 8
    initializer_range: float = 0.02

    def to_dict(self):
        return asdict(self)


class GatedMLP(nn.Module):
    def __init__(self, d_model, d_intermediate, device=None, dtype=None):
        super().__init__()
        self.fc1 = nn.Linear(d_model, 2 * d_intermediate, bias=False, device=device, dtype=dtype)
        self.fc2 = nn.Linear(d_intermediate, d_model, bias=False, device=device, dtype=dtype)

    def forward(self, x):
        y, gate = self.fc1(x).chunk(2, dim=-1)
        return self.fc2(y * F.silu(gate))


class Block(nn.Module):
    def __init__(self, config: Mamba3Config, layer_idx: int, device=None, dtype=None):
        super().__init__()
        self.norm = RMSNorm(config.d_model, eps=config.norm_epsilon, device=device, dtype=dtype)
        self.mixer = Mamba3(config.d_model, layer_idx=layer_idx, n_layer=config.n_layer, device=device,
                            dtype=dtype, **config.ssm_cfg)
        if config.d_intermediate > 0:
            self.norm2 = RMSNorm(config.d_model, eps=config.norm_epsilon, device=device, dtype=dtype)
            self.mlp = GatedMLP(config.d_model, config.d_intermediate, device=device, dtype=dtype)
        else:
            self.norm2 = self.mlp = None

    def forward(self, h, inference_params=None, cu_seqlens=None):
        h = h + self.mixer(self.norm(h), cu_seqlens=cu_seqlens, inference_params=inference_params)
        if self.mlp is not None:
            h = h + self.mlp(self.norm2(h))
        return h


class Backbone(nn.Module):
    def __init__(self, config: Mamba3Config, vocab_size: int, device=None, dtype=None):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, config.d_model, device=device, dtype=dtype)
        self.layers = nn.ModuleList(Block(config, i, device, dtype) for i in range(config.n_layer))
        self.norm_f = RMSNorm(config.d_model, eps=config.norm_epsilon, device=device, dtype=dtype)

    def forward(self, input_ids, inference_params=None, cu_seqlens=None):
        h = self.embedding(input_ids)
        for layer in self.layers:
            h = layer(h, inference_params=inference_params, cu_seqlens=cu_seqlens)
        return self.norm_f(h)


class Mamba3LMHeadModel(nn.Module):
    def __init__(self, config: Mamba3Config, device=None, dtype=None):
        super().__init__()
        self.config = config
        mult = config.pad_vocab_size_multiple
        vocab = math.ceil(config.vocab_size / mult) * mult
        self.backbone = Backbone(config, vocab, device, dtype)
        self.lm_head = nn.Linear(config.d_model, vocab, bias=False, device=device, dtype=dtype)
        self._init_weights()
        if config.tie_embeddings:
            self.lm_head.weight = self.backbone.embedding.weight

    def _init_weights(self):
        nn.init.normal_(self.backbone.embedding.weight, std=self.config.initializer_range)
        per_layer = 2 if self.config.d_intermediate > 0 else 1
        for name, p in self.named_parameters():
            if name.endswith("out_proj.weight") or name.endswith("fc2.weight"):
                with torch.no_grad():                 # GPT-2 style: residual branches scaled by depth
                    p /= math.sqrt(per_layer * self.config.n_layer)

    def allocate_inference_cache(self, batch_size, max_seqlen, dtype=None, **kwargs):
        return {i: layer.mixer.allocate_inference_cache(batch_size, max_seqlen, dtype=dtype)
                for i, layer in enumerate(self.backbone.layers)}

    def forward(self, input_ids, position_ids=None, inference_params=None, num_last_tokens=0, cu_seqlens=None,
                **kwargs):
        h = self.backbone(input_ids, inference_params=inference_params, cu_seqlens=cu_seqlens)
        if num_last_tokens > 0:
            h = h[:, -num_last_tokens:]
        return CausalLMOutput(logits=self.lm_head(h))

    @torch.no_grad()
    def generate(self, input_ids, max_new_tokens=None, max_length=None, temperature=1.0, top_k=1, top_p=0.0,
                 use_cache=True, eos_token_id=None, generator=None, **kwargs):
        """Continue ``input_ids`` (B, T) by up to ``max_new_tokens`` tokens (or up to ``max_length`` in total).

        Greedy when top_k == 1 or temperature == 0 (the default); otherwise samples from the softmax at
        ``temperature``, restricted to the top_k tokens (0 = all) and to the top_p nucleus (0 = off), with
        ``generator``. use_cache=True decodes with the recurrent state (prefill once, then one step per token);
        use_cache=False re-runs the whole sequence each step (slow; for testing). Rows that produced
        ``eos_token_id`` keep emitting it. Returns (B, T + new) token ids.
        """
        bsz, seqlen = input_ids.shape
        if max_new_tokens is None:
            if max_length is None:
                raise ValueError("give max_new_tokens or max_length")
            max_new_tokens = max_length - seqlen
        vocab = self.config.vocab_size
        tokens = input_ids
        done = torch.zeros(bsz, dtype=torch.bool, device=input_ids.device)
        params = None
        if use_cache:
            params = InferenceParams(max_seqlen=seqlen + max_new_tokens, max_batch_size=bsz)
            params.key_value_memory_dict = self.allocate_inference_cache(bsz, seqlen + max_new_tokens)
        for i in range(max_new_tokens):
            if not use_cache:
                logits = self(tokens, num_last_tokens=1).logits[:, -1]
            elif i == 0:
                logits = self(tokens, inference_params=params, num_last_tokens=1).logits[:, -1]
                params.seqlen_offset = seqlen
            else:
                logits = self(tokens[:, -1:], inference_params=params).logits[:, -1]
                params.seqlen_offset += 1
            nxt = sample(logits[:, :vocab], temperature, top_k, top_p, generator)
            if eos_token_id is not None:
                nxt = torch.where(done, torch.full_like(nxt, eos_token_id), nxt)
                done = done | (nxt == eos_token_id)
            tokens = torch.cat([tokens, nxt[:, None]], dim=1)
            if eos_token_id is not None and bool(done.all()):
                break
        return tokens


def sample(logits, temperature=1.0, top_k=1, top_p=0.0, generator=None):
    """One token per row from logits (B, V): greedy for top_k == 1 or temperature == 0."""
    if top_k == 1 or temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k and top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p and 0.0 < top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = sorted_logits.softmax(dim=-1)
        drop = probs.cumsum(dim=-1) - probs > top_p            # keep the smallest prefix reaching top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
