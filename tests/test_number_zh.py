"""Chinese text normalisation for the talker (`model/number_zh.py`).

Expected readings follow the reference talker's `TalkerTN` (inclusionAI/Ming commit
3954fcb880ff5e61ff128bcf7f1ec344d46a6fe3, "release Ming-flash-omni 2.0", `talker_tn/`):
* `talker_re.json` "proper_noun": 罗素2000 → 罗素两千, 日经225 → 日经二百二十五, 沪深300 → 沪深三百, C++ → C加加;
  "money" ¥ → 元, $ → 美元; "measure_after" km → 千米, ℃ → 摄氏度; "char_map0" ③ → 三;
* `re_utils/re_digit.py` `REDigit.to_string`: 4-digit groups with 万/亿, 两 before 千/百, "十" for 10–19;
* `re_utils/re_date.py` `REDate.to_string`: year digit by digit without leading zeros, 号 when no 日;
* `re_utils/re_time.py` `RETime.to_string`: 两点, 整, 零X分, am/pm → 上午/下午 in front;
* `re_utils/re_decimal.py`, `re_frac.py`, `re_percent.py`: a点b (digits one by one), b分之a, 百分之N,
  ranges joined with 至;
* `talker_pre_processor.py`: markdown emphasis, links, code and emoticons are dropped, `1,000` → `1000`.
"""

from __future__ import annotations

import pytest

from realtime_ming.model.number_zh import cardinal, normalize_zh, preprocess, talker_tn
from realtime_ming.model.talker_text import talker_job_texts


@pytest.mark.parametrize(("digits", "reading"), [
    ("0", "零"), ("7", "七"), ("10", "十"), ("12", "十二"), ("20", "二十"), ("100", "一百"), ("110", "一百一十"),
    ("101", "一百零一"), ("2000", "两千"), ("2002", "两千零二"), ("10086", "一万零八十六"),
    ("100000", "十万"), ("1000000", "一百万"), ("20000", "二万"), ("100000000", "一亿"),
    ("120000305", "一亿两千万零三百零五"),
])
def test_cardinal_follows_the_reference_digit_reading(digits, reading):
    assert cardinal(digits) == reading


@pytest.mark.parametrize(("text", "spoken"), [
    # proper nouns exactly as talker_re.json lists them
    ("罗素2000指数", "罗素两千指数"), ("日经225", "日经二百二十五"), ("沪深300涨了", "沪深三百涨了"), ("学C++", "学C加加"),
    # dates
    ("2024年5月1日放假", "二零二四年五月一日放假"), ("2023年10月", "二零二三年十月"), ("3月8号", "三月八号"),
    ("会议在2023-10-01举行", "会议在二零二三年十月一号举行"), ("生于1990年", "生于一九九零年"),
    # times
    ("下午3:05开始", "下午三点零五分开始"), ("早上2:00出发", "早上两点整出发"), ("现在是10:30", "现在是十点三十分"),
    ("截止23:59:09", "截止二十三点五十九分零九秒"), ("9:15pm见", "下午九点十五分见"),
    # decimals, fractions, percentages, ranges
    ("圆周率约3.14", "圆周率约三点一四"), ("占1/3", "占三分之一"), ("增长了12.5%", "增长了百分之十二点五"),
    ("降了5~10%", "降了百分之五至十"),
    ("降了5%~10%左右", "降了百分之五至百分之十左右"), ("大约3~5个", "大约三至五个"), ("3-5人", "三至五人"),
    # money and units
    ("价格是¥199", "价格是一百九十九元"), ("花了$20", "花了二十美元"), ("跑了5km", "跑了五千米"),
    ("气温-5℃", "气温负五摄氏度"), ("重1.5kg", "重一点五千克"),
    # identifiers read digit by digit
    ("电话13800138000", "电话一三八零零一三八零零零"), ("区号010-88886666", "区号零一零八八八八六六六六"),
    ("编号007", "编号零零七"),
    # characters the reference maps
    ("第③条", "第三条"), ("第Ⅱ卷", "第二卷"),
])
def test_chinese_readings(text, spoken):
    assert talker_tn(text) == spoken


def test_preprocessing_drops_markup_links_and_emoticons():
    assert preprocess("**重点**：看 https://example.com/a?b=1 这里😀") == "重点：看这里"
    assert preprocess("一共1,000,000元") == "一共1000000元"
    assert preprocess("代码`x = 1`不读") == "代码不读"
    assert talker_tn("### 标题\n第二行") == "标题第二行"


def test_english_text_only_gets_preprocessing():
    """number_en handles English numbers first; the Chinese rules never touch Latin-only text."""
    assert talker_tn("I have 3 cats **now**") == "I have 3 cats now"


def test_no_ascii_digit_survives_in_chinese_text():
    spoken = normalize_zh("第1名得了98.5分，第2名是97分，共3/4的人在2:30前交卷，编号A12")
    assert not any(ch.isdigit() for ch in spoken), spoken


def test_talker_jobs_use_the_normaliser_for_chinese_fragments():
    texts = talker_job_texts("今天是2024年5月1日，气温25℃，我们下午3:30出发。", tn=talker_tn)
    assert "".join(texts) == "今天是二零二四年五月一日，气温二十五摄氏度，我们下午三点三十分出发。"
