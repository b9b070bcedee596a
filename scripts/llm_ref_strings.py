"""The fixed strings that ``make_llm_reference.py`` tokenizes with llama.cpp.

Reference-tool data only (never imported by ggmlpy). ``tokenizer_strings()`` returns the same
list on every run: hand-written cases plus mixes drawn with a fixed seed from ``FRAGMENTS``.
"""

from __future__ import annotations

import random

HANDWRITTEN: list[str] = [
    # empty and whitespace only
    "", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\t\t\n", "\u00a0", "\u3000",
    " \t \n", "\n\n\n\n", "          ",
    # ASCII prose
    "Hello", "hello", "HELLO", "Hello world", "Hello, world!", "hello world.",
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times.",
    "I can't believe it's not butter!", "They're here; we'll see.", "Don't stop.",
    "She said: \"yes\".", "'quoted' and \"double quoted\"", "a b c d e f g",
    "Supercalifragilisticexpialidocious", "antidisestablishmentarianism",
    "The year 1999 was followed by 2000.", "e.g. i.e. etc. Mr. Mrs. Dr.",
    "What's the time? It's 3 o'clock.", "no-one re-entered the co-op",
    "CamelCaseWordsTogether", "snake_case_identifier", "SCREAMING_SNAKE_CASE",
    "ALL CAPS SENTENCE HERE", "MiXeD cAsE tExT",
    # leading / trailing / multiple spaces
    " Hello", "  Hello", "   Hello", "Hello ", "Hello  ", " Hello ", "Hello   world",
    "Hello \n world", " leading space", "trailing space ", "  two leading",
    "double  space  between", "tab\tseparated\tvalues", "\tindented with tab",
    "line one\nline two", "line one\n\nline three", "ends with newline\n", "\nstarts with newline",
    "windows\r\nline endings\r\n", "mixed \t\n whitespace", "a  b   c    d     e",
    "trailing tabs\t\t", "    four space indent", "        eight space indent",
    # digits and numbers
    "0", "1", "7", "42", "123", "1234", "12345", "123456789", "1234567890123456789",
    "3.14159", "-273.15", "+1", "1e10", "6.022e23", "0x1F", "0b1010", "1,000,000", "1 000 000",
    "2024-01-31", "12:34:56", "v1.2.3", "100%", "$9.99", "\u20ac12,50", "#1", "No. 5",
    "99 bottles of beer", "phone: +1-555-0100", "3rd 4th 21st 102nd", "1/2 3/4", "x^2 + y^2 = z^2",
    "007", "0000", "10000000000000000000000000000000",
    # punctuation
    ".", ",", "!", "?", "...", "!!!", "?!", "--", "---", "\u2014", "\u2013", "()", "[]", "{}",
    "<>", "@#$%^&*", "~`|\\", "\"", "'", "''", "\u201cHello\u201d", "\u2018single\u2019",
    "\u00ab\u00bb", "\u00bfQu\u00e9?", "\u00a1Hola!", "a.b.c", "end.", "wait...", "(parenthetical)",
    # code
    "def add(a, b):\n    return a + b\n",
    "for (int i = 0; i < n; ++i) { sum += x[i]; }",
    "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)",
    "if x == 1:\n\tprint('one')\nelse:\n\tprint('other')",
    "SELECT name, age FROM users WHERE age > 30 ORDER BY name;",
    "<div class=\"main\"><p>Hi</p></div>", "{\"key\": \"value\", \"n\": [1, 2, 3]}",
    "#include <stdio.h>\nint main(void) { return 0; }", "x += 1; y -= 2; z *= 3; w /= 4;",
    "a && b || !c", "arr[i][j] = f(g(h(x)))", "lambda x: x ** 2", "    pass",
    "// comment\n/* block */", "fn main() { println!(\"hi\"); }", "$ ls -la /usr/bin | grep py",
    "git commit -m \"fix: bug\"", "console.log(`template ${value}`);", "<?xml version=\"1.0\"?>",
    "key=value&other=thing", "0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3)))",
    # URLs, paths, e-mail
    "https://example.com", "https://www.example.org/path/to/page?query=1&b=two#frag",
    "http://localhost:8080/api/v1/items", "ftp://files.example.net/pub/file.tar.gz",
    "user@example.com", "first.last+tag@sub.domain.co.uk", "/usr/local/lib/python3.11/site-packages",
    "C:\\Windows\\System32\\drivers", "./relative/path/file.txt", "~/Documents/notes.md",
    "www.example.com", "example.com/index.html",
    # emoji
    "\U0001F600", "\U0001F44D", "\U0001F44D\U0001F3FD", "\u2764\ufe0f", "\U0001F1EB\U0001F1F7",
    "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466", "I love \U0001F355 and \U0001F37A",
    "\U0001F680\U0001F680\U0001F680", "\u2600\ufe0f sunny", "\U0001F9D1\u200d\U0001F4BB coder",
    "smile :) \U0001F642", "\u2705 done",
    # CJK
    "\u4f60\u597d", "\u4f60\u597d\uff0c\u4e16\u754c\uff01", "\u6211\u559c\u6b22\u5b66\u4e60\u673a\u5668\u5b66\u4e60\u3002",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8", "\u3053\u3093\u306b\u3061\u306f", "\u30ab\u30bf\u30ab\u30ca",
    "\ud55c\uad6d\uc5b4 \ubb38\uc7a5\uc785\ub2c8\ub2e4", "\uc548\ub155\ud558\uc138\uc694",
    "\u6771\u4eac\u306f\u65e5\u672c\u306e\u9996\u90fd\u3067\u3059\u3002", "\u4e2d\u6587 English \u6df7\u5408",
    "\u9f8d\u9f98\u9750", "\u3400\u3401\u3402",
    # Arabic, Hebrew, Cyrillic, Greek, Indic, Thai
    "\u0645\u0631\u062d\u0628\u0627", "\u0627\u0644\u0633\u0644\u0627\u0645 \u0639\u0644\u064a\u0643\u0645",
    "\u0627\u0644\u0644\u063a\u0629 \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u062c\u0645\u064a\u0644\u0629",
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd", "\u041f\u0440\u0438\u0432\u0435\u0442",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043a\u0430\u043a \u0434\u0435\u043b\u0430?",
    "\u041c\u043e\u0441\u043a\u0432\u0430 \u2014 \u0441\u0442\u043e\u043b\u0438\u0446\u0430 \u0420\u043e\u0441\u0441\u0438\u0438.",
    "\u0423\u043a\u0440\u0430\u0457\u043d\u0441\u044c\u043a\u0430 \u043c\u043e\u0432\u0430",
    "\u039a\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1", "\u03b1\u03b2\u03b3\u03b4\u03b5",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a", "\u10d2\u10d0\u10db\u10d0\u10e0\u10ef\u10dd\u10d1\u10d0",
    "\u0532\u0561\u0580\u0587", "\u12e8\u12a0\u121b\u122d\u129b",
    # accented Latin and combining marks
    "caf\u00e9", "cafe\u0301", "na\u00efve", "nai\u0308ve", "\u00fcber", "u\u0308ber", "Stra\u00dfe",
    "fa\u00e7ade", "\u00e0 la carte", "S\u00e3o Paulo", "Z\u00fcrich", "\u0141\u00f3d\u017a",
    "\u00c5ngstr\u00f6m", "A\u030angstro\u0308m", "\u0e01\u0e34\u0e19", "o\u0302\u0323", "\u00f1and\u00fa",
    "r\u00e9sum\u00e9", "cr\u00e8me br\u00fbl\u00e9e", "\u0130stanbul", "\u0131\u0130i", "\ufb01nance",
    "e\u0301\u0301\u0301", "\u0300", "a\u0332b\u0332",
    # special-token text (SentencePiece and GPT-2 style)
    "<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", "<bos>Hello", "Hello<eos>",
    " <bos> ", "<bos><bos>", "text <start_of_turn> text", "<start_of_turn", "start_of_turn>",
    "<START_OF_TURN>", "< bos >", "<<bos>>", "<|endoftext|>", "Hello<|endoftext|>world",
    "<|im_start|>user\nhello<|im_end|>", "<|im_end|>", "<|endoftext", "<s>", "</s>",
    "<start_of_image>", "<end_of_image>", "<unused0>", "[multimodal]",
    # byte fallback, rare symbols, control characters
    "\x00", "\x01", "\x07", "\x1b[31mred\x1b[0m", "\x7f", "\x0b\x0c", "a\x00b",
    "\u200b", "zero\u200bwidth", "\u200d", "\ufeffBOM", "\ufffd", "\uffff", "\u2028", "\u202e",
    "\U0001D54F\U0001D55A", "\U0001F0A1", "\U00010348", "\U000E0041", "\U0010FFFD",
    "\u2603\u2604\u2605", "\u2211 \u222b \u221a \u221e", "\u00b1\u00d7\u00f7", "\u2190\u2192\u2191\u2193",
    "\u2122 \u00ae \u00a9", "\u00bd \u00bc \u00be", "\u2460\u2461\u2462", "\u16a0\u16a2\u16a6",
    "\ua000\ua001", "\U00013000\U00013001", "\u0f00\u0f01", "\U0001F9EC", "\u0489\u20dd",
    "\u2e3b", "\u3030", "\U0001FAE0",
    # repetition
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "abababababababab", "the the the the the",
    "=================", "----------------------------------------", "**********", "________",
    "!!!!!!!!!!!!!!!!!!!!", "\n\n\n\n\n\n\n\n", "..........", "\u3002\u3002\u3002",
    "haha" * 10, "\U0001F600" * 5, "0" * 40, "1234" * 8,
    # mixed
    "Mixed \u4e2d\u6587, \u0440\u0443\u0441\u0441\u043a\u0438\u0439, and \u0627\u0644\u0639\u0631\u0628\u064a\u0629 in one line.",
    "Price: \u20ac5 / \u00a34 / \u00a5600 / $6", "Temp: 25\u00b0C (77\u00b0F)", "naive vs na\u00efve vs nai\u0308ve",
    "Email me at a@b.c \U0001F4E7!", "Tab\there, newline\nthere, and a \u00e9 too",
    "The function f(x) = x\u00b2 + 2x + 1 has a root at x = \u22121.",
    "Q: What is 2+2?\nA: 4", "1. First\n2. Second\n3. Third", "- item one\n- item two\n  - nested",
    "| a | b |\n|---|---|\n| 1 | 2 |", "# Heading\n\nSome *bold* and _italic_ text.",
]

FRAGMENTS: list[str] = [
    "the", " the", "model", " model", "token", "izer", " Gemma", " llama", "123", " 45",
    "6789", ",", ".", "!", "?", " ", "  ", "\n", "\t", "caf\u00e9", "\u4f60\u597d",
    "\u041f\u0440\u0438\u0432\u0435\u0442", "\u0645\u0631\u062d\u0628\u0627", "\U0001F600",
    "e\u0301", "<bos>", "<start_of_turn>", "<eos>", "<|endoftext|>", "http://x.io/", "def ",
    "()", "{}", "[0]", " = ", "==", "->", "\u00fc", "\u00df", "\u00f1", "\u2014", "\u2019s",
    "'s", "'ll", " don't", "ABC", "xyz", "_", "__init__", "\\n", "\u00a0", "\u200b", "\x01",
    "\u2211", "\U0001F44D\U0001F3FD", " 3.14", "1e-5", "\u3053\u3093", "\ud55c", "\u0928\u092e",
]


def tokenizer_strings(n_mixes: int = 80, seed: int = 20261201) -> list[str]:
    """Return the hand-written strings followed by ``n_mixes`` seeded fragment mixes."""
    rng = random.Random(seed)
    mixes = []
    for _ in range(n_mixes):
        k = rng.randint(2, 9)
        mixes.append("".join(rng.choice(FRAGMENTS) for _ in range(k)))
    return HANDWRITTEN + mixes


BPE_TRAIN_PARAGRAPHS: list[str] = [
    ("The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst of "
    "times. She said that they're going to the market, and we'll meet them there at noon."),
    ("A tokenizer splits text into pieces. Byte pair encoding starts from single bytes and merges "
    "the most frequent adjacent pair again and again until the vocabulary is large enough."),
    "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(i, add(i, i))\n",
    "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)\ny = x.sum(axis=0)\n",
    ("int main(void) {\n    int sum = 0;\n    for (int i = 0; i < 100; ++i) { sum += i; }\n"
    "    return sum;\n}\n"),
    ("Numbers like 1, 2, 3, 10, 42, 100, 1000, 2024 and 3.14159 appear in text. Prices are $9.99 "
    "or 12.50 euros; the date is 2024-01-31 and the time 12:34:56."),
    "https://www.example.com/path/to/page?query=1 is a link; user@example.com is an e-mail.",
    "caf\u00e9 na\u00efve \u00fcber Stra\u00dfe fa\u00e7ade r\u00e9sum\u00e9 S\u00e3o Paulo Z\u00fcrich",
    ("\u041f\u0440\u0438\u0432\u0435\u0442, \u043a\u0430\u043a \u0434\u0435\u043b\u0430? "
    "\u041c\u043e\u0441\u043a\u0432\u0430 \u2014 \u0441\u0442\u043e\u043b\u0438\u0446\u0430."),
    ("\u4f60\u597d\uff0c\u4e16\u754c\uff01\u6211\u559c\u6b22\u5b66\u4e60\u3002 "
    "\u3053\u3093\u306b\u3061\u306f \u0645\u0631\u062d\u0628\u0627 \U0001F600 \U0001F44D"),
]

BPE_TRAIN_WORDS: list[str] = (
    "time person year way day thing man world life hand part child eye woman place work week case "
    "point government company number group problem fact be have do say get make go know take see "
    "come think look want give use find tell ask seem feel try leave call good new first last long "
    "great little own other old right big high different small large next early young important few "
    "public bad same able to of in for on with at by from up about into over after beneath under "
    "above the and a that I it not he as you this but his they her she or an will my one all would "
    "there their what so out if who which go me when can like no just him know take people into "
    "year your some could them than then now only its also back after use two how our well even "
    "because any these give most us model token vocabulary merge byte pair encoding tensor graph "
    "backend buffer memory compute kernel matrix vector layer attention embedding weight bias norm "
    "softmax logits sample greedy decode prompt context cache batch thread device stream event"
).split()


def bpe_training_corpus(n_sentences: int = 1500, seed: int = 7) -> list[str]:
    """Return the deterministic training text of the tiny byte-level BPE (a list of lines)."""
    rng = random.Random(seed)
    lines = list(BPE_TRAIN_PARAGRAPHS) * 20 + HANDWRITTEN * 3
    for _ in range(n_sentences):
        n = rng.randint(4, 14)
        words = [rng.choice(BPE_TRAIN_WORDS) for _ in range(n)]
        words[0] = words[0].capitalize()
        sep = rng.choice([" ", " ", " ", ", "])
        line = sep.join(words) + rng.choice([".", ".", "?", "!", ";"])
        if rng.random() < 0.2:
            line += " " + str(rng.randint(0, 99999))
        lines.append(line)
    return lines
