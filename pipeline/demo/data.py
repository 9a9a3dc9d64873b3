"""The demo's task: English with digits in, German with every number written out in words.

A narrow, fully specified translation domain, chosen so that a small pair trained on a 2-core CPU
can learn it completely (real jobs bring their own models). Each prompt is a list of 1 to 6
items separated by "; ", each item one of:

* a quantity with a unit: ``250 g of sugar`` -> ``zweihundertfünfzig Gramm Zucker``
* an amount of money: ``$4,312.50`` -> ``viertausenddreihundertzwölf Dollar und fünfzig Cent``
* a date: ``on Monday, March 12, 2024`` -> ``am Montag, dem zwölften März zweitausendvierundzwanzig``
* a time: ``at 14:30`` -> ``um vierzehn Uhr dreißig``

References are made by well-kept libraries, never by a model: ``num2words(lang="de")`` for the
numbers (cardinals, ordinals, years, currency amounts) and Babel's CLDR data for the month and
weekday names (English and German), the unit names (German long forms, English short forms) and
the currency symbols. Training examples are drawn fresh at every step from a seeded generator;
the demo prompts come from another seed, so they are combinations the models never saw.
"""

from __future__ import annotations

import datetime
import functools
import random
import sysconfig
from pathlib import Path

from num2words import num2words

TASK_PREFIX = "translate English to German: "
KINDS = ("quantity", "amount", "date", "time")
SEPARATOR = "; "

# (CLDR unit, goods as (English, German)) : the unit's German long name comes from Babel
_GOODS = {
    "mass-kilogram": [("flour", "Mehl"), ("sugar", "Zucker"), ("rice", "Reis"), ("apples", "Äpfel"),
                      ("potatoes", "Kartoffeln"), ("salt", "Salz")],
    "mass-gram": [("butter", "Butter"), ("cheese", "Käse"), ("coffee", "Kaffee"), ("tea", "Tee")],
    "volume-liter": [("milk", "Milch"), ("water", "Wasser"), ("oil", "Öl"), ("juice", "Saft")],
    "volume-milliliter": [("milk", "Milch"), ("water", "Wasser"), ("oil", "Öl"), ("vinegar", "Essig")],
    "length-meter": [("rope", "Seil"), ("cable", "Kabel"), ("fabric", "Stoff")],
    "length-centimeter": [("rope", "Seil"), ("cable", "Kabel"), ("fabric", "Stoff")],
}
_CURRENCIES = ("EUR", "USD", "GBP")


@functools.cache
def _cldr() -> dict:
    from babel.dates import get_day_names, get_month_names
    from babel.numbers import get_currency_symbol
    from babel.units import format_unit

    def unit_name(unit: str, locale: str, length: str, n: int) -> str:
        return format_unit(n, unit, locale=locale, length=length).replace(str(n), "", 1).strip()

    return {
        "months_en": [get_month_names("wide", locale="en")[m] for m in range(1, 13)],
        "months_de": [get_month_names("wide", locale="de")[m] for m in range(1, 13)],
        "days_en": [get_day_names("wide", locale="en")[d] for d in range(7)],  # Monday first, as date.weekday()
        "days_de": [get_day_names("wide", locale="de")[d] for d in range(7)],
        "units_en": {u: unit_name(u, "en", "short", 2) for u in _GOODS},
        "units_de": {u: unit_name(u, "de", "long", 2) for u in _GOODS},  # plural: quantities start at 2
        "symbols": {c: get_currency_symbol(c, locale="en") for c in _CURRENCIES},
    }


def words(n: int) -> str:
    return num2words(n, lang="de")


def quantity(rng: random.Random, max_number: int) -> tuple[str, str]:
    c = _cldr()
    unit = rng.choice(sorted(_GOODS))
    en_good, de_good = rng.choice(_GOODS[unit])
    n = rng.randint(2, max_number)
    return f"{n} {c['units_en'][unit]} of {en_good}", f"{words(n)} {c['units_de'][unit]} {de_good}"


def amount(rng: random.Random, max_number: int) -> tuple[str, str]:
    c = _cldr()
    cur = rng.choice(_CURRENCIES)
    whole, cents = rng.randint(2, max_number), rng.randint(1, 99)
    de = num2words(whole + cents / 100, lang="de", to="currency", currency=cur)
    return f"{c['symbols'][cur]}{whole:,}.{cents:02d}", de


def date(rng: random.Random, max_number: int) -> tuple[str, str]:
    c = _cldr()
    d = datetime.date(1950, 1, 1) + datetime.timedelta(days=rng.randrange(100 * 365))
    wd = d.weekday()
    en = f"on {c['days_en'][wd]}, {c['months_en'][d.month - 1]} {d.day}, {d.year}"
    ordinal = num2words(d.day, lang="de", to="ordinal") + "n"  # dem zwölften
    de = f"am {c['days_de'][wd]}, dem {ordinal} {c['months_de'][d.month - 1]} {num2words(d.year, lang='de', to='year')}"
    return en, de


def time(rng: random.Random, max_number: int) -> tuple[str, str]:
    h, m = rng.randrange(24), rng.randrange(60)
    hour = "ein" if h == 1 else words(h)  # "ein Uhr", not "eins Uhr"
    de = f"um {hour} Uhr" + (f" {words(m)}" if m else "")
    return f"at {h}:{m:02d}", de


MAKERS = {"quantity": quantity, "amount": amount, "date": date, "time": time}


def example(rng: random.Random, n_items: int, kinds: tuple[str, ...] = KINDS,
            max_number: int = 9999, labels: bool = False, distinct: bool = False,
            ordered: bool = False) -> tuple[str, str]:
    """(English prompt, German reference) with `n_items` items of the given kinds. `labels`: each
    item starts with its letter, "(a) ", "(b) ", ..., in the prompt and the reference alike.
    `distinct`: no kind twice in a prompt (at most one item of each kind, in random order);
    `ordered`: and the items in the order of `kinds` (an order line: what, price, day, time)."""
    if distinct or ordered:
        chosen = rng.sample(kinds, n_items)
        if ordered:
            chosen.sort(key=kinds.index)
        items = [MAKERS[kind](rng, max_number) for kind in chosen]
    else:
        items = [MAKERS[rng.choice(kinds)](rng, max_number) for _ in range(n_items)]
    if labels:
        items = [(f"({chr(97 + i)}) {e}", f"({chr(97 + i)}) {d}") for i, (e, d) in enumerate(items)]
    return TASK_PREFIX + SEPARATOR.join(e for e, _ in items), SEPARATOR.join(d for _, d in items)


def tokenizer_corpus(n: int, seed: int, kinds: tuple[str, ...] = KINDS, labels: bool = False,
                     exclude: frozenset[str] = frozenset()) -> list[str]:
    """Texts to learn the tokenizer from: `n` examples of 1 to 4 items, none of whose prompts is in `exclude`."""
    rng = random.Random(seed)
    out = []
    while len(out) < 2 * n:
        en, de = example(rng, rng.randint(1, 4), kinds, labels=labels)
        if en not in exclude:
            out += [en, de]
    return out


def stdlib_root() -> Path:
    """The standard library's directory (text for `pipeline.bench.cross`'s tokenizers; not the demo's data)."""
    return Path(sysconfig.get_paths()["stdlib"])
