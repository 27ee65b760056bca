"""Small tokenizers built in code, one per model type, for random models (tests and debugging need no download).

Each has the vocabulary kind and the special tokens of its family's real tokenizer, so pairs come out as they do
for the real models: WordPiece ``[CLS] A [SEP] B [SEP]`` with segment ids (BERT, ELECTRA; DistilBERT and, with
WordPiece standing in for its BPE, ModernBERT without),
byte-level BPE ``<s> A </s></s> B </s>`` (RoBERTa), SentencePiece unigram ``<s> A </s></s> B </s>`` (XLM-R) and
``[CLS] A [SEP] B [SEP]`` (ALBERT, DeBERTa-v3). The pieces are the tiny word list below, its characters, and (BPE)
merges learnt from it; a random model's config takes its vocabulary size and special ids from its tokenizer.
"""

from __future__ import annotations

import copy
import json
import string
from functools import cache
from typing import Any

from transformers import (
    AlbertTokenizer,
    BertTokenizer,
    DebertaV2Tokenizer,
    DistilBertTokenizer,
    RobertaTokenizer,
    XLMRobertaTokenizer,
)

# Words of the demo texts and common English, so the tiny tokenizers do not split every word into characters.
_TINY_WORDS = """the a an of to in and or is was are were be been he she it they we you i his her their
its this that these those who what where when why how which on at by for with from as not no yes
did does do has have had will would can could said asked left went came born lives lived city town
river year years day days old new first last after before because but if then than there here one
two three four five six seven eight nine ten million people doctor smith paid stop really bank""".split()
WORDS = list(dict.fromkeys(_TINY_WORDS))
_CHARS = string.ascii_lowercase + string.digits + string.punctuation


def tiny_vocab() -> list[str]:
    """WordPiece vocabulary of the tiny BERT tokenizer: specials, characters, pieces, common words."""
    pieces = ["##" + c for c in string.ascii_lowercase + string.digits]
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *_CHARS, *pieces, *WORDS]


def _unigram(specials: list[str]) -> list[tuple[str, float]]:
    """A SentencePiece unigram vocabulary: the specials, each word after a word boundary, single characters."""
    letters = [c for c in _CHARS + string.ascii_uppercase]
    return [(s, 0.0) for s in specials] + [("\u2581" + w, -5.0) for w in WORDS] + [("\u2581", -8.0)] + \
        [(c, -10.0) for c in letters]


def _byte_level_bpe() -> RobertaTokenizer:
    import tokenizers

    bpe = tokenizers.ByteLevelBPETokenizer()
    text = " ".join(WORDS + [w.capitalize() for w in WORDS]) + " " + " ".join(_CHARS)
    bpe.train_from_iterator([text], vocab_size=2000, min_frequency=1, show_progress=False,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    model = json.loads(bpe._tokenizer.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return RobertaTokenizer(vocab=model["vocab"], merges=merges)


@cache
def _build(model_type: str):
    if model_type in ("roberta", "camembert"):
        return _byte_level_bpe()
    if model_type == "xlm-roberta":
        return XLMRobertaTokenizer(vocab=_unigram(["<s>", "<pad>", "</s>", "<unk>", "<mask>"]))
    if model_type == "albert":
        return AlbertTokenizer(vocab=_unigram(["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]))
    if model_type == "deberta-v2":
        return DebertaV2Tokenizer(vocab=_unigram(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    wordpiece = DistilBertTokenizer if model_type in ("distilbert", "modernbert") else BertTokenizer  # no segment ids
    return wordpiece(vocab={token: i for i, token in enumerate(tiny_vocab())})


def tiny_tokenizer(model_type: str = "bert"):
    """The tiny tokenizer of ``model_type`` (WordPiece for the types not named in the module docstring)."""
    return copy.deepcopy(_build(model_type))  # the caller may change it (padding side, max length)


def tiny_config_fields(model_type: str) -> dict[str, Any]:
    """A random model's vocabulary size and special token ids, from its tiny tokenizer (RoBERTa places positions
    after its padding id; ModernBERT's default ids lie outside a tiny vocabulary)."""
    tokenizer = _build(model_type)
    size = max(tokenizer.get_vocab().values()) + 1  # the WordPiece list names "a" and "i" twice: ids run past len
    return {"vocab_size": size, "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": tokenizer.cls_token_id, "cls_token_id": tokenizer.cls_token_id,
            "eos_token_id": tokenizer.sep_token_id, "sep_token_id": tokenizer.sep_token_id}
