"""Part 3's task, its data: reverse a sequence of 1 to 16 symbols (ten words of the tiny model's vocabulary),
given right-aligned after filler words and closed by a separator. A sequence's hash decides its side, training
or held-out, so no held-out sequence is ever trained on; the held-out items are distinct and no palindrome (which
copying the prompt answers right), the palindromes met on the way kept apart."""

import itertools
import random
import zlib

SYMBOLS, FIRST_WORD, SEPARATOR, FILLER, WIDTH = 10, 10, "w5", "w6", 16


def _side(seed, held):
    """`seed`'s generator's sequences of 1-16 symbols that fall on the held-out side, or on the training side."""
    rng = random.Random(seed)
    while True:
        sequence = tuple(rng.randrange(SYMBOLS) for _ in range(rng.randint(1, WIDTH)))
        if (zlib.crc32(bytes(sequence)) % 5 == 0) == held:
            yield sequence


def sequences(seed, count, held):
    """`count` symbol sequences of 1-16 symbols from `seed`'s generator, on the held-out side or the training side."""
    return list(itertools.islice(_side(seed, held), count))


def palindrome(sequence):
    return answer(sequence) == sequence


def held_out(seed, count):
    """The held-out items: `count` distinct sequences of the held-out side (none is a training sequence: a
    sequence's hash decides its side) that are not palindromes, and apart from them the distinct palindromes the
    same draws met (copying the prompt answers those right, so they are scored apart)."""
    items, palindromes, seen = [], [], set()
    for sequence in _side(seed, held=True):
        if sequence not in seen:
            seen.add(sequence)
            (palindromes if palindrome(sequence) else items).append(sequence)
            if len(items) == count:
                return items, palindromes


def _words(symbols):
    return " ".join(f"w{FIRST_WORD + s}" for s in symbols)


def prompt(sequence):
    return " ".join([FILLER] * (WIDTH - len(sequence)) + [_words(sequence), SEPARATOR])


def answer(sequence):
    return tuple(reversed(sequence))


def rows(found):
    return [{"prompt": prompt(s), "completion": " " + _words(answer(s))} for s in found]


def baselines(held):
    """The trivial answers' exact-match accuracy on the held-out sequences: the prompt copied, and the most
    frequent training answer (never right: held-out sequences are disjoint from training ones)."""
    copied = sum(map(palindrome, held)) / len(held)
    return {"copy the prompt": copied, "the majority answer": 0.0}
