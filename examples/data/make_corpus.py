"""Writes tiny_tales.txt: the char-level corpus of examples/gpt.py.

A deterministic synthetic text (this generator and its output are released
into the public domain, CC0): short tales built from a small grammar, with
names that recur within a tale, agreement (a/an, he/she), counting rhymes
and dialogue, so a small character model has words, syntax and some
longer-range structure to learn. No download needed; run
``python examples/data/make_corpus.py`` to regenerate the same bytes.
"""
import os
import random

NAMES = [("Anna", "she"), ("Ben", "he"), ("Clara", "she"), ("Dan", "he"),
         ("Emma", "she"), ("Finn", "he"), ("Greta", "she"), ("Hugo", "he"),
         ("Ida", "she"), ("Jonas", "he"), ("Kira", "she"), ("Leo", "he")]
ANIMALS = ["cat", "dog", "owl", "fox", "horse", "rabbit", "goat", "eagle",
           "mouse", "otter"]
PLACES = ["the forest", "the river", "the old mill", "the market",
          "the hill", "the garden", "the harbour", "the village"]
ADJ = ["little", "old", "brave", "quiet", "clever", "tired", "happy",
       "angry", "small", "kind"]
THINGS = ["apple", "key", "lantern", "map", "coin", "basket", "umbrella",
          "egg", "orange", "book"]
VERBS = [("found", "find"), ("lost", "lose"), ("carried", "carry"),
         ("hid", "hide"), ("shared", "share"), ("painted", "paint")]
NUMBERS = ["one", "two", "three", "four", "five", "six", "seven", "eight",
           "nine", "ten"]


def art(word):
    return ("an " if word[0] in "aeiou" else "a ") + word


def tale(rng):
    (a, pa), (b, pb) = rng.sample(NAMES, 2)
    animal, place = rng.choice(ANIMALS), rng.choice(PLACES)
    thing, adj = rng.choice(THINGS), rng.choice(ADJ)
    past, base = rng.choice(VERBS)
    n = rng.randrange(2, 10)
    lines = [
        f"Once upon a time {a} walked to {place} with {art(adj)} {animal}.",
        f"There {pa} {past} {art(thing)}.",
        f'"Look, {b}!" said {a}. "I {past} {art(thing)} at {place}."',
        f'{b} smiled. "Can I {base} it too?" {pb} asked.',
    ]
    if rng.random() < 0.5:
        lines.append(f"So {a} and {b} counted the {thing}s: " +
                     ", ".join(NUMBERS[:n]) + ".")
        lines.append(f"There were {NUMBERS[n - 1]} {thing}s in all.")
    else:
        lines.append(f"The {animal} was {adj}, and {pa} gave it the "
                     f"{thing}.")
    lines.append(f"In the evening {a} and {b} went home, and the {animal} "
                 f"slept.")
    return " ".join(lines)


def main(path=None, size=300_000, seed=1234):
    rng = random.Random(seed)
    out, total = [], 0
    while total < size:
        t = tale(rng) + "\n\n"
        out.append(t)
        total += len(t)
    path = path or os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "tiny_tales.txt")
    with open(path, "w", encoding="ascii", newline="\n") as f:
        f.write("".join(out))
    return path


if __name__ == "__main__":
    print(main())
