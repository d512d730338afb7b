"""Chinese text normalisation for the talker: digits, dates, times, money, units → spoken hanzi.

The reference talker runs every fragment through `TalkerTN` before synthesis ([MING]
`talker_tn/talker_tn.py`: `TalkerPreProcessor`, then for Chinese text the `TalkerRE` rules of
`talker_tn/re_utils/*` and a compiled zh FST). This module is our own rule set for the same job,
following the readings those rules produce:

* markup the talker cannot speak is dropped (LaTeX `$…$`, URLs, code spans, markdown images,
  `**` / `###` / `---`, emoticons U+1F600–U+1F64F, tabs and newlines), thousands separators go
  (`1,000` → `1000`) and spaces between non-Latin characters are removed (`TalkerPreProcessor`);
* integers are read as cardinals by 4-digit groups (万, 亿, …) with 两 before 千/百, a leading
  "一十" shortened to 十 and inner zeros read once (`REDigit.to_string`);
* `YYYY年M月D日`, `YYYY-MM-DD` / `.` / `/` dates: the year digit by digit, month and day as
  cardinals, 号 when no 日 follows (`REDate`); `H:MM[:SS]` times with 两点, 整, 零X分 and
  am/pm → 上午/下午 (`RETime`); `a.b` → a点b, digits after the point one by one (`REDecimal`);
  `a/b` → b分之a (`REFrac`); `N%` → 百分之N (`REPercent`); currency signs and codes before a
  number → the currency after it (`REMoneyBefore`, `talker_re.json` "money"); units after a number
  (`REMeasureAfter`, `talker_re.json` "measure_after", a subset); `a-b` / `a~b` between two values of
  the same kind → a至b;
* digit strings that are identifiers (a leading zero, or more than 10 digits: phone numbers) and
  `0xx-xxxxxxx` phone numbers are read digit by digit; the reference's proper nouns (`沪深300`…) as it
  lists them (`talker_re.json` "proper_noun").

Only text holding CJK ideographs gets the Chinese rules; English text is left to `number_en`.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["cardinal", "digits", "normalize_zh", "preprocess", "talker_tn"]

_DIGIT = dict(zip("0123456789", "零一二三四五六七八九"))
_DIGIT_LIANG = {**_DIGIT, "2": "两"}
_GROUP_UNITS = ("", "万", "亿", "兆")
_MAX_CARDINAL_DIGITS = 10  # longer digit strings (phone numbers, ids) are read digit by digit
_CJK_RE = re.compile(r"[\u4e00-\u9fff]")

# ---- pre-processing (all text) --------------------------------------------------------------------
_PRE_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\$\$.*?\$\$|\$[^$\d][^$]*?\$", re.DOTALL), ""),  # LaTeX (not "$5 … $6" money)
    (re.compile(r"https?://[a-zA-Z0-9./?=&_:%#-]+|www\.[a-zA-Z0-9./?=&_:%#-]+"), ""),
    (re.compile(r"```.*?```", re.DOTALL), ""),
    (re.compile(r"`[^`]*`"), ""),
    (re.compile(r"!\[[^\]]*\]\([^)]*\)"), ""),
    (re.compile(r"(?<=\d),(?=\d{3}(?!\d))"), ""),
    (re.compile(r"(?<=[^a-zA-Z.])[ ]+(?=[^a-zA-Z.])"), ""),
    (re.compile(r"(?<=[a-zA-Z])[ ]+(?=[a-zA-Z])"), " "),
    (re.compile(r"\*\*\*|\*\*|###|---"), ""),
)
_SILENT = {cp: None for cp in range(0x1F600, 0x1F650)}
_SILENT.update({ord(ch): None for ch in "▼●★☆■□▲△◆◇○◎√×✔✖\t\n\r\f"})


def preprocess(text: str) -> str:
    """Drop what the talker cannot speak (markup, links, emoticons); `1,000` → `1000`."""
    for pattern, repl in _PRE_RULES:
        text = pattern.sub(repl, text)
    return text.translate(_SILENT)


# ---- number readings ------------------------------------------------------------------------------
def _group(four: str) -> str:
    """Reading of one group of up to four digits (no unit), "" for all zeros."""
    four = four.lstrip("0")
    if len(four) == 2 and four[0] == "1":
        return "十" + (_DIGIT[four[1]] if four[1] != "0" else "")
    out = []
    pending_zero = False
    for i, d in enumerate(four):
        place = len(four) - i - 1
        if d == "0":
            pending_zero = True
            continue
        if pending_zero:
            out.append("零")
            pending_zero = False
        if place >= 2:
            out.append(_DIGIT_LIANG[d] + ("千" if place == 3 else "百"))
        elif place == 1:
            out.append(_DIGIT[d] + "十")
        else:
            out.append(_DIGIT[d])
    return "".join(out)


def digits(text: str) -> str:
    """Digit by digit: `2024` → 二零二四."""
    return "".join(_DIGIT[d] for d in text)


def cardinal(text: str) -> str:
    """Cardinal reading of a digit string: `10` → 十, `2000` → 两千, `10086` → 一万零八十六."""
    text = text.lstrip("0")
    if not text:
        return "零"
    if len(text) > 4 * len(_GROUP_UNITS):
        return digits(text)
    groups = []
    while text:
        groups.append(text[-4:])
        text = text[:-4]
    out = []
    zero_gap = False
    for unit, four in reversed(list(zip(_GROUP_UNITS, groups))):
        reading = _group(four)
        if not reading:
            zero_gap = True
            continue
        if out and (zero_gap or four[0] == "0"):
            out.append("零")
        out.append(reading + unit)
        zero_gap = False
    return "".join(out)


def _number(text: str) -> str:
    """An integer in running text: a cardinal, or digit by digit for identifiers."""
    if (len(text) > 1 and text[0] == "0") or len(text) > _MAX_CARDINAL_DIGITS:
        return digits(text)
    return cardinal(text)


def _decimal(int_part: str, frac_part: str) -> str:
    return f"{cardinal(int_part)}点{digits(frac_part)}"


def _value(text: str) -> str:
    """A number that may have a decimal part."""
    int_part, _, frac_part = text.partition(".")
    return _decimal(int_part, frac_part) if frac_part else cardinal(int_part)


# ---- patterns (applied in order) ------------------------------------------------------------------
_NUM = r"\d+(?:\.\d+)?"
_RANGE = r"\s*[-~～]\s*"
_MONTHS = r"(?:0?[1-9]|1[0-2])"
_DAYS = r"(?:0?[1-9]|[12]\d|3[01])"
_MONEY_BEFORE = {  # talker_re.json "money" (the common ones), longest first when matched
    "CNY": "人民币", "RMB": "元", "USD": "美元", "EUR": "欧元", "GBP": "英镑", "JPY": "日元", "HKD": "港元",
    "HK$": "港元", "US$": "美元", "A$": "澳元", "$": "美元", "¥": "元", "￥": "元", "€": "欧元", "£": "英镑",
    "￡": "英镑", "₩": "韩元", "₹": "印度卢比",
}
_MEASURE_AFTER = {  # talker_re.json "measure_after" (a subset), case as the reference lists it
    "km²": "平方千米", "km2": "平方千米", "m²": "平方米", "m2": "平方米", "cm²": "平方厘米", "m³": "立方米",
    "km/h": "千米每小时", "km": "千米", "cm": "厘米", "mm": "毫米", "kg": "千克", "mg": "毫克", "g": "克",
    "ml": "毫升", "mL": "毫升", "L": "升", "°C": "摄氏度", "℃": "摄氏度", "°F": "华氏度", "℉": "华氏度",
    "kW": "千瓦", "kWh": "千瓦时", "kwh": "千瓦时", "kw": "千瓦", "GHz": "吉赫兹", "MHz": "兆赫兹", "Hz": "赫兹",
    "GB": "吉字节", "MB": "兆字节", "KB": "千字节", "TB": "太字节", "ms": "毫秒", "m": "米", "s": "秒",
    "h": "小时", "min": "分钟",
}


def _alternation(keys) -> str:
    return "|".join(re.escape(k) for k in sorted(keys, key=len, reverse=True))


_DATE_FULL = re.compile(rf"(\d{{4}})年({_MONTHS})月({_DAYS})([日号])")
_DATE_YM = re.compile(rf"(\d{{4}})年({_MONTHS})月")
_DATE_MD = re.compile(rf"(?<!\d)({_MONTHS})月({_DAYS})([日号])")
_DATE_Y = re.compile(r"(?<!\d)(\d{4})年")
_DATE_SEP = re.compile(rf"(?<![\d.])(\d{{4}})([-./])({_MONTHS})\2({_DAYS})(?![\d.])")
_TIME = re.compile(
    r"(?<![\d.:])(\d{1,2})[:：](\d{1,2})(?:[:：](\d{1,2}))?(?![\d:])\s*(a\.m\.|p\.m\.|am|pm|AM|PM|A\.M\.|P\.M\.)?"
)
_MONEY = re.compile(rf"({_alternation(_MONEY_BEFORE)})\s?({_NUM})(?:{_RANGE}({_NUM}))?(万|亿)?")
_MEASURE = re.compile(rf"({_NUM})(?:{_RANGE}({_NUM}))?\s?({_alternation(_MEASURE_AFTER)})(?![a-zA-Z²³])")
_PERCENT_PAIR = re.compile(rf"({_NUM})[%％]{_RANGE}({_NUM})[%％]")
_PERCENT = re.compile(rf"({_NUM})(?:{_RANGE}({_NUM}))?[%％]")
_FRACTION = re.compile(r"(?<![\d/])(\d+)/(\d+)(?![\d/])")
# a hyphen joins a range only between short numbers without a leading zero (not "010-8888")
_NUM_RANGE = re.compile(r"(?<![\d.])([1-9]\d{0,3}(?:\.\d+)?|\d+\.\d+|0)\s*[-~～]\s*([1-9]\d{0,3}(?:\.\d+)?|\d+\.\d+|0)(?![\d.])")
_DECIMAL = re.compile(r"(?<![\d.])(\d+)\.(\d+)(?![\d.])")
_NEGATIVE = re.compile(r"(?<![0-9A-Za-z.])-(?=\d)")
_INTEGER = re.compile(r"\d+")
_NOON = {"am": "上午", "a.m.": "上午", "pm": "下午", "p.m.": "下午"}


def _date_full(m: re.Match[str]) -> str:
    return f"{digits(m[1].lstrip('0'))}年{cardinal(m[2])}月{cardinal(m[3])}{m[4]}"


def _time(m: re.Match[str]) -> str:
    hour, minute, second, noon = m[1], m[2], m[3], m[4]
    if int(hour) > 24 or int(minute) > 59 or (second is not None and int(second) > 59):
        return m[0]
    out = _NOON[noon.lower()] if noon else ""
    out += "两点" if hour in ("2", "02") else f"{cardinal(hour)}点"
    if int(minute) == 0 and (second is None or int(second) == 0):
        return out + "整"
    out += _minutes(minute, "分")
    if second is not None:
        out += _minutes(second, "秒")
    return out


def _minutes(value: str, unit: str) -> str:
    if int(value) == 0:
        return f"零{unit}"
    if len(value) == 1 or value[0] == "0":
        return f"零{cardinal(value)}{unit}"
    return f"{cardinal(value)}{unit}"


def _ranged(first: str, second: str | None) -> str:
    return _value(first) if second is None else f"{_value(first)}至{_value(second)}"


def _money(m: re.Match[str]) -> str:
    big = m[4] or ""
    return f"{_ranged(m[2], m[3])}{big}{_MONEY_BEFORE[m[1]]}"


def _measure(m: re.Match[str]) -> str:
    return f"{_ranged(m[1], m[2])}{_MEASURE_AFTER[m[3]]}"


def _percent(m: re.Match[str]) -> str:
    if m[2] is None:
        return f"百分之{_value(m[1])}"
    return f"百分之{_value(m[1])}至{_value(m[2])}"


_PHONE = re.compile(r"(?<![\d-])(0\d{1,3})-(\d{5,8})(?![\d-])")
_PROPER_NOUNS = {  # talker_re.json "proper_noun": read as listed, before any number rule
    "上证50": "上证五十", "沪深300": "沪深三百", "中证500": "中证五百", "科创50": "科创五十", "标普500": "标普五百",
    "道琼斯30": "道琼斯三十", "纳斯达克100": "纳斯达克一百", "罗素2000": "罗素两千", "富时100": "富时一百",
    "日经225": "日经二百二十五", "标准普尔500": "标准普尔五百", "c++": "C加加", "C++": "C加加",
}
_PROPER_NOUN = re.compile(rf"(?<!\d)({_alternation(_PROPER_NOUNS)})(?!\d)")

_RULES: tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], str]], ...] = (
    (_PROPER_NOUN, lambda m: _PROPER_NOUNS[m[1]]),
    (_NEGATIVE, lambda m: "负"),
    (_PHONE, lambda m: digits(m[1]) + digits(m[2])),
    (_DATE_SEP, lambda m: f"{digits(m[1].lstrip('0'))}年{cardinal(m[3])}月{cardinal(m[4])}号"),
    (_DATE_FULL, _date_full),
    (_DATE_YM, lambda m: f"{digits(m[1].lstrip('0'))}年{cardinal(m[2])}月"),
    (_DATE_MD, lambda m: f"{cardinal(m[1])}月{cardinal(m[2])}{m[3]}"),
    (_DATE_Y, lambda m: f"{digits(m[1].lstrip('0'))}年"),
    (_TIME, _time),
    (_MONEY, _money),
    (_PERCENT_PAIR, lambda m: f"百分之{_value(m[1])}至百分之{_value(m[2])}"),
    (_PERCENT, _percent),
    (_MEASURE, _measure),
    (_FRACTION, lambda m: f"{cardinal(m[2])}分之{cardinal(m[1])}"),
    (_NUM_RANGE, lambda m: f"{_value(m[1])}至{_value(m[2])}"),
    (_DECIMAL, lambda m: _decimal(m[1], m[2])),
    (_INTEGER, lambda m: _number(m[0])),
)
# talker_re.json "char_map0": Roman numerals Ⅰ–Ⅻ and circled numbers ①–⑳ become their readings
_CHAR_MAP = {0x2160 + i: cardinal(str(i + 1)) for i in range(12)}
_CHAR_MAP.update({0x2460 + i: cardinal(str(i + 1)) for i in range(20)})
_CHAR_MAP.update({0xFF10 + i: str(i) for i in range(10)})  # full-width digits


def normalize_zh(text: str) -> str:
    """Chinese rules only (no pre-processing): every ASCII digit in `text` ends up read as hanzi."""
    text = text.translate(_CHAR_MAP)
    for pattern, repl in _RULES:
        text = pattern.sub(repl, text)
    return text


def talker_tn(text: str) -> str:
    """What the talker is given for a fragment: pre-processing, then the Chinese rules for Chinese text."""
    text = preprocess(text)
    return normalize_zh(text) if _CJK_RE.search(text) else text
