"""Dependency treebanks in CoNLL-U (Universal Dependencies), read with the ``conllu`` library.

A sentence is its words (syntactic words, as UD's own evaluation counts them): multiword-token ranges (``1-2``,
the surface form of ``do`` + ``n't``) and empty nodes (``3.1``, enhanced dependencies) are skipped. Each word has
a gold head (0 is the root, else the 1-based index of another word) and a relation (``deprel``, subtypes kept:
``nmod:poss``). Every tree is checked: heads in range, exactly one root, no cycle; a file that breaks this is a
``UserError`` naming the file, the sentence and the word.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from headlab.errors import UserError


@dataclass(frozen=True)
class Sentence:
    """One tree: ``words[i]`` has head ``heads[i]`` (0: root; else 1-based) by relation ``relations[i]``."""

    sent_id: str
    words: tuple[str, ...]
    heads: tuple[int, ...]
    relations: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.words)


def read_conllu(path: str | Path, what: str = "syntax.conllu") -> list[Sentence]:
    """Every sentence of a CoNLL-U file, checked (module docstring); ``what`` names the setting in errors."""
    import conllu
    from conllu.exceptions import ParseException

    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what}={str(path)!r}: no such file; give a CoNLL-U treebank (.conllu)")
    sentences = []
    try:
        with path.open(encoding="utf-8") as handle:
            for number, tokens in enumerate(conllu.parse_incr(handle), start=1):
                sentence = _sentence(tokens, number, path, what)
                if sentence is not None:
                    sentences.append(sentence)
    except ParseException as error:
        raise UserError(f"{what}={str(path)!r} is not CoNLL-U: {error}") from None
    except UnicodeDecodeError as error:
        raise UserError(f"{what}={str(path)!r} is not UTF-8 text: {error}") from None
    if not sentences:
        raise UserError(f"{what}={str(path)!r} holds no sentence (CoNLL-U: one word per line, 10 tab-separated "
                        "columns, a blank line after each sentence)")
    return sentences


def _sentence(tokens, number: int, path: Path, what: str) -> Sentence | None:
    sent_id = tokens.metadata.get("sent_id", f"#{number}")
    where = f"{what}={str(path)!r}, sentence {sent_id}"
    words = [token for token in tokens if isinstance(token["id"], int)]  # not a range, not an empty node
    if not words:
        return None
    for index, token in enumerate(words, start=1):
        if token["id"] != index or "deprel" not in token or token.get("head") is None:
            raise UserError(f"{where}: word {token['id']} ({token['form']!r}) is not a CoNLL-U word line with an "
                            "integer HEAD and a DEPREL (10 tab-separated columns, ids 1, 2, ... in order)")
    heads = tuple(int(token["head"]) for token in words)
    check_tree(heads, where)
    return Sentence(str(sent_id), tuple(token["form"] for token in words), heads,
                    tuple(str(token["deprel"]) for token in words))


def check_tree(heads: tuple[int, ...], where: str) -> None:
    """A ``UserError`` unless ``heads`` (1-based, 0 the root) is a tree: in range, one root, no cycle."""
    count = len(heads)
    for word, head in enumerate(heads, start=1):
        if not 0 <= head <= count or head == word:
            raise UserError(f"{where}: word {word} has head {head}, outside 0..{count} or itself")
    roots = [word for word, head in enumerate(heads, start=1) if head == 0]
    if len(roots) != 1:
        raise UserError(f"{where}: {len(roots)} roots (words {roots}); a tree has exactly one word with head 0")
    for word in range(1, count + 1):
        seen, node = set(), word
        while node != 0:
            if node in seen:
                raise UserError(f"{where}: the heads of words {sorted(seen)} form a cycle")
            seen.add(node)
            node = heads[node - 1]
