"""Dependency treebanks in CoNLL-U (Universal Dependencies), read with the ``conllu`` library.

A sentence is its words (syntactic words, as UD's own evaluation counts them): multiword-token ranges (``1-2``,
the surface form of ``do`` + ``n't``) and empty nodes (``3.1``, enhanced dependencies) are skipped. Each word has
a gold head (0 is the root, else the 1-based index of another word) and a relation (``deprel``, subtypes kept:
``nmod:poss``). Every tree is checked: heads in range, exactly one root, no cycle; a file that breaks this is a
``UserError`` naming the file, the sentence and the word. Relations are stripped of surrounding white space; one
that is empty or ``_``, holds white space, or differs from another of the file only in case (``nsubj`` and
``NSUBJ``: two rows that print alike) is a ``UserError`` too, as is a root (head 0) under another relation than
``root`` (other tools' ``ROOT`` is read as ``root``). A byte-order mark at the file's start is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from headlab.errors import UserError

# Not scored as relations (Clark et al.): a head never attends to ROOT, so a root row is 0 by construction; punctuation
# attaches by convention, not syntax. The table's ``all`` row counts every other word.
LEFT_OUT_RELATIONS = ("root", "punct")


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
        found = "a folder" if path.is_dir() else "no such file"
        raise UserError(f"{what}={str(path)!r}: {found}; give a CoNLL-U treebank (.conllu)")
    sentences = []
    labels: dict[str, tuple[str, str]] = {}  # lower-cased relation -> (the relation, where it was first seen)
    number = 0
    try:
        with path.open(encoding="utf-8-sig") as handle:  # -sig: a byte-order mark is not part of the first line
            for number, tokens in enumerate(conllu.parse_incr(handle), start=1):
                sentence = _sentence(tokens, number, path, what)
                if sentence is not None:
                    _check_labels_alike(sentence, labels, f"{what}={str(path)!r}")
                    sentences.append(sentence)
    except ParseException as error:
        raise UserError(f"{what}={str(path)!r} is not CoNLL-U: sentence {number + 1} of the file: {error} (a word "
                        "line is 10 tab-separated columns; HEAD, the 7th, is a word's number or 0)") from None
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
    relations = tuple(str(token["deprel"] or "").strip() for token in words)
    for index, relation in enumerate(relations, start=1):
        if relation in ("", "_") or any(character.isspace() for character in relation):
            raise UserError(f"{where}: word {index} ({words[index - 1]['form']!r}) has the relation "
                            f"{str(words[index - 1]['deprel'])!r}; give a dependency relation (DEPREL, the 8th "
                            "column), e.g. nsubj or nmod:poss")
    relations = _root_named(heads, relations, words, where)
    return Sentence(str(sent_id), tuple(token["form"] for token in words), heads, relations)


def _root_named(heads: tuple[int, ...], relations: tuple[str, ...], words, where: str) -> tuple[str, ...]:
    """``relations`` with the root's (head 0) written ``root``, as every scored row assumes: other tools' ``ROOT``
    is read so; a root under another relation, or a word called ``root`` with a head, is a ``UserError`` (it would
    be scored as a word of that relation, or left out)."""
    named = list(relations)
    for index, (head, relation) in enumerate(zip(heads, relations)):
        word = f"word {index + 1} ({words[index]['form']!r})"
        if head == 0 and relation.lower() != "root":
            raise UserError(f"{where}: {word} is the root (head 0) but has the relation {relation!r}; the root's "
                            "relation is root")
        if head != 0 and relation.lower() == "root":
            raise UserError(f"{where}: {word} has the relation {relation!r} but head {head}; only the word with "
                            "head 0 is the root")
        if head == 0:
            named[index] = "root"
    return tuple(named)


def _check_labels_alike(sentence: Sentence, labels: dict[str, tuple[str, str]], file: str) -> None:
    """A ``UserError`` when a relation differs from one seen before only in case (they would be two relations)."""
    for index, relation in enumerate(sentence.relations, start=1):
        here = f"sentence {sentence.sent_id}, word {index}"
        first, seen_at = labels.setdefault(relation.lower(), (relation, here))
        if first != relation:
            raise UserError(f"{file}, {here} ({sentence.words[index - 1]!r}) has the relation {relation!r}, which "
                            f"differs only in case from {first!r} ({seen_at}); write each relation one way")


def sentences_digest(sentences: list[Sentence]) -> str:
    """A hash of the trees' content (words, heads, relations; not their ids nor the file's name): two jobs scored
    the same sentences exactly when their digests are equal."""
    from headlab.files import config_hash

    return config_hash([[list(s.words), list(s.heads), list(s.relations)] for s in sentences])


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
