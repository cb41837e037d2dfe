"""The Gemma-style tokenizer files of the vision fixtures (t5gemma2-*, gemma3-vision).

The vocabulary is the project's byte-level BPE (tests/fixtures/llama-gqa3/tokenizer.json: Llama-3
split regex + ByteLevel, 4001 BPE entries) with its ids shifted up by N_LEADING and Gemma's
special tokens placed around it, as Gemma 3's tokenizer places them:

    0 <pad>   1 <eos>   2 <bos>   3 <unk>          (Gemma: the same ids)
    4 .. 4004                                      the 4001 BPE entries (llama-gqa3 id + 4)
    4005 <start_of_image>  (boi)                   (Gemma 3: 255999)
    4006 <end_of_image>    (eoi)                   (Gemma 3: 256000)
    4007 <image_soft_token> (image token)          (Gemma 3: 262144, the last id)

so the tokenizer holds TOKENIZER_SIZE = 4008 ids; the models' vocab_size is VOCAB_SIZE = 4016
(8 embedding rows no token maps to, as Gemma 3's 262208 > 262145). The seven specials are
added tokens (special, not normalized) and also entries of the BPE model's vocab, as in Gemma's
tokenizer.json. The post-processor is TemplateProcessing ``<bos> $A`` (pair ``<bos> $A <bos> $B``):
``<bos>`` prepended, no ``<eos>`` appended, like Gemma 3's tokenizer.json (its tokenizer_config
says add_bos_token true, add_eos_token false). The T5Gemma 2 folders use the same tokenizer
(google/t5gemma-2-* ship Gemma 3's vocabulary and specials), so the encoder input carries no EOS
either; transformers' T5Gemma 2 code adds none.

tokenizer_config.json follows google/gemma-3-4b-it's: bos/eos/pad/unk tokens, the processor's
named specials ``boi_token``, ``eoi_token``, ``image_token`` both as top-level keys and in
``extra_special_tokens`` (so ``tokenizer.boi_token_id`` etc. exist), padding_side left,
processor_class Gemma3Processor, add_bos_token true / add_eos_token false. One deliberate
difference: ``"tokenizer_class": "PreTrainedTokenizerFast"`` where the Hub says
``GemmaTokenizer``. In transformers 5 GemmaTokenizer rebuilds the pipeline from its own class
(SentencePiece-style: Replace(" ", "▁") normalizer, Split(" ") pre-tokenizer, BPE with
byte_fallback), keeping only vocab, merges and post-processor from tokenizer.json, which would
mangle a byte-level vocabulary; PreTrainedTokenizerFast (TokenizersBackend) uses tokenizer.json
as it is, so transformers and the ``tokenizers`` library encode alike.

processor_config.json / preprocessor_config.json: as google/gemma-3-4b-it's (Gemma3Processor,
image_seq_length = mm_tokens_per_image; Gemma3ImageProcessor with size {height, width} =
image_size, resample 2 (bilinear), rescale_factor 1/255, image_mean / image_std 0.5, and
do_convert_rgb / do_pan_and_scan / pan_and_scan_* null: the processor then uses its own defaults,
do_convert_rgb True (alpha composited on white) and no pan-and-scan).
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixture_common import TOKENIZER_JSON, write_json  # noqa: E402

PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
BOI, EOI, IMAGE = "<start_of_image>", "<end_of_image>", "<image_soft_token>"
PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3
N_LEADING = 4
"""BPE ids are shifted by this many leading specials."""
BPE_SIZE = 4001
BOI_ID, EOI_ID, IMAGE_ID = N_LEADING + BPE_SIZE, N_LEADING + BPE_SIZE + 1, N_LEADING + BPE_SIZE + 2
TOKENIZER_SIZE = IMAGE_ID + 1
VOCAB_SIZE = 4016
"""The models' vocab_size (embedding rows): TOKENIZER_SIZE + 8 rows no token maps to."""
SPECIAL_IDS = (PAD_ID, EOS_ID, BOS_ID, UNK_ID, BOI_ID, EOI_ID, IMAGE_ID)
SPECIALS = {PAD: PAD_ID, EOS: EOS_ID, BOS: BOS_ID, UNK: UNK_ID, BOI: BOI_ID, EOI: EOI_ID,
            IMAGE: IMAGE_ID}


def tokenizer_json(source: str = TOKENIZER_JSON) -> dict:
    """The tokenizer.json dict: source's byte-level BPE, ids shifted by N_LEADING, the Gemma
    specials added, ``<bos> $A`` post-processor."""
    with open(source, encoding="utf-8") as f:
        tok = json.load(f)
    model = tok["model"]
    assert model["type"] == "BPE" and len(model["vocab"]) == BPE_SIZE, source
    assert sorted(model["vocab"].values()) == list(range(BPE_SIZE)), source
    vocab = {PAD: PAD_ID, EOS: EOS_ID, BOS: BOS_ID, UNK: UNK_ID}
    vocab.update({k: v + N_LEADING for k, v in model["vocab"].items()})
    vocab.update({BOI: BOI_ID, EOI: EOI_ID, IMAGE: IMAGE_ID})
    assert len(vocab) == TOKENIZER_SIZE and sorted(vocab.values()) == list(range(TOKENIZER_SIZE))
    model["vocab"] = vocab
    tok["added_tokens"] = [
        dict(id=i, content=s, single_word=False, lstrip=False, rstrip=False, normalized=False,
             special=True)
        for s, i in sorted(SPECIALS.items(), key=lambda kv: kv[1])]

    def special(type_id):
        return {"SpecialToken": {"id": BOS, "type_id": type_id}}

    tok["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [special(0), {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [special(0), {"Sequence": {"id": "A", "type_id": 0}}, special(1),
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {BOS: {"id": BOS, "ids": [BOS_ID], "tokens": [BOS]}},
    }
    return tok


def tokenizer_config() -> dict:
    """tokenizer_config.json in google/gemma-3-4b-it's style (see the module docstring)."""
    named = {"boi_token": BOI, "eoi_token": EOI, "image_token": IMAGE}
    return {
        "add_bos_token": True, "add_eos_token": False, **named, "bos_token": BOS,
        "clean_up_tokenization_spaces": False, "eos_token": EOS, "extra_special_tokens": named,
        "model_max_length": 1000000000000000019884624838656, "pad_token": PAD,
        "padding_side": "left", "processor_class": "Gemma3Processor",
        "spaces_between_special_tokens": False, "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": UNK,
    }


def preprocessor_config(image_size: int, mm_tokens_per_image: int) -> dict:
    """preprocessor_config.json as google/gemma-3-4b-it's, for image_size."""
    return {
        "do_convert_rgb": None, "do_normalize": True, "do_pan_and_scan": None,
        "do_rescale": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5],
        "image_processor_type": "Gemma3ImageProcessor", "image_seq_length": mm_tokens_per_image,
        "image_std": [0.5, 0.5, 0.5], "pan_and_scan_max_num_crops": None,
        "pan_and_scan_min_crop_size": None, "pan_and_scan_min_ratio_to_activate": None,
        "processor_class": "Gemma3Processor", "resample": 2,
        "rescale_factor": 0.00392156862745098,
        "size": {"height": image_size, "width": image_size},
    }


def write_tokenizer_files(out: str, image_size: int, mm_tokens_per_image: int) -> None:
    """tokenizer.json (compact), tokenizer_config.json, processor_config.json and
    preprocessor_config.json into out."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(json.dumps(tokenizer_json()))
    tok.save(os.path.join(out, "tokenizer.json"), pretty=False)
    write_json(os.path.join(out, "tokenizer_config.json"), tokenizer_config())
    write_json(os.path.join(out, "processor_config.json"),
               {"image_seq_length": mm_tokens_per_image, "processor_class": "Gemma3Processor"})
    write_json(os.path.join(out, "preprocessor_config.json"),
               preprocessor_config(image_size, mm_tokens_per_image))


def check_tokenizer(folder: str, texts) -> None:
    """The folder's tokenizer.json and transformers' AutoTokenizer agree on texts (BOS first, no
    EOS), the specials have their ids, and the BPE ids are llama-gqa3's shifted by N_LEADING."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    ref = Tokenizer.from_file(TOKENIZER_JSON)
    hf = AutoTokenizer.from_pretrained(folder)
    for s, i in SPECIALS.items():
        assert tok.token_to_id(s) == i and hf.convert_tokens_to_ids(s) == i, s
    assert (hf.boi_token, hf.eoi_token, hf.image_token) == (BOI, EOI, IMAGE)
    assert (hf.boi_token_id, hf.eoi_token_id, hf.image_token_id) == (BOI_ID, EOI_ID, IMAGE_ID)
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (BOS_ID, EOS_ID, PAD_ID)
    for text in texts:
        ids = tok.encode(text).ids
        assert ids == hf(text)["input_ids"], text
        assert ids[0] == BOS_ID and EOS_ID not in ids, text
        plain = [i for i in ids if i not in SPECIAL_IDS]
        if not any(s in text for s in SPECIALS):
            assert plain == [i + N_LEADING for i in ref.encode(text).ids[1:]], text
