"""The TRL cell's id tokenizer gives TRL the miniverl cells' token ids (equal work), or the bench refuses."""

from __future__ import annotations

import pytest

from miniverl.bench.common import random_prompt_ids
from miniverl.bench.grpo_trl import encode_equal_work, id_tokenizer


def test_ids_with_the_digits_of_special_tokens_encode_to_themselves() -> None:
    tok = id_tokenizer(200)
    assert tok("102 12 120 9", add_special_tokens=False)["input_ids"] == [102, 12, 120, 9]
    assert (tok.pad_token_id, tok.unk_token_id, tok.eos_token_id) == (0, 1, 2)


def test_the_bench_prompts_encode_to_the_same_ids_and_lengths() -> None:
    ids = random_prompt_ids(16, 32, 49152, seed=0)
    texts = encode_equal_work(id_tokenizer(49152), ids)
    assert len(texts) == 16
    assert [len(x) for x in id_tokenizer(49152)(texts, add_special_tokens=False)["input_ids"]] == [32] * 16


def test_a_tokenizer_that_splits_an_id_is_refused() -> None:
    class Splitting:
        def __call__(self, texts: list[str], add_special_tokens: bool) -> dict[str, list[list[int]]]:
            return {"input_ids": [[1, 0, 2] for _ in texts]}

    with pytest.raises(RuntimeError, match="unequal work"):
        encode_equal_work(Splitting(), [[102]])
