"""Model outputs → wire answers: softmax / sigmoid, top-k, decoded tokens, answer spans and entities (as
transformers does)."""

from __future__ import annotations

import numpy as np

from .tokenization import RequestTokenizer, SpanEncoded


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=-1, keepdims=True)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-logits))


def default_function(problem_type: str | None, num_labels: int) -> str:
    """transformers' rule: sigmoid for multi-label or single-output models, else softmax."""
    if problem_type == "multi_label_classification" or num_labels == 1:
        return "sigmoid"
    return "softmax"


def top_k_indices(scores: np.ndarray, k: int) -> np.ndarray:
    """The k highest scores' indices, highest first, ties to the lower index: exactly a stable
    argsort of -scores cut at k, without sorting the whole 30,522-entry vocabulary per [MASK]
    (a full sort was most of the event loop's time under load)."""
    if k >= len(scores):
        return np.argsort(-scores, kind="stable")
    kth_largest = np.partition(scores, len(scores) - k)[len(scores) - k]
    candidates = np.flatnonzero(scores >= kth_largest)  # ascending, so ties stay in index order
    return candidates[np.argsort(-scores[candidates], kind="stable")][:k]


def classification_scores(logits: np.ndarray, id2label: dict[int, str], function: str, top_k: int | None) -> list[dict]:
    if function == "softmax":
        scores = softmax(logits.astype(np.float64))
    elif function == "sigmoid":
        scores = sigmoid(logits.astype(np.float64))
    else:
        scores = logits.astype(np.float64)
    order = np.argsort(-scores, kind="stable")
    if top_k is not None:
        order = order[:top_k]
    return [{"label": id2label[int(i)], "score": float(scores[i])} for i in order]


def fill_mask_candidates(
    logits: np.ndarray,
    input_ids: np.ndarray,
    mask_position: int,
    tokenizer: RequestTokenizer,
    top_k: int,
    target_ids: list[int] | None,
    single_mask: bool = True,
) -> list[dict]:
    """Candidates for one [MASK]: probabilities over the whole vocabulary, then the top_k (of the
    targets, when given); `sequence` is the input with this mask filled, special tokens dropped,
    except with several masks, where (as transformers does) they are kept so the other [MASK]s show.
    The text around the mask is decoded once, not once per candidate (RequestTokenizer.filled_sequences)."""
    probs = softmax(logits.astype(np.float64))
    if target_ids is not None:
        candidates = np.asarray(target_ids)
        order = candidates[np.argsort(-probs[candidates], kind="stable")][:top_k]
    else:
        order = top_k_indices(probs, top_k)
    sequence = tokenizer.filled_sequences(input_ids, mask_position, skip_special_tokens=single_mask)
    return [
        {
            "sequence": sequence(int(token_id)),
            "score": float(probs[token_id]),
            "token": int(token_id),
            "token_str": tokenizer.decode([token_id], skip_special_tokens=False),
        }
        for token_id in order
    ]


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


# -- question answering: transformers' QuestionAnsweringPipeline, the whole context in one window ----------

# The start and end logits of tokens that cannot be in the answer, before the softmax (transformers' value).
EXCLUDED_LOGIT = -10000.0


def question_answers(
    logits: np.ndarray,
    encoded: SpanEncoded,
    context: str,
    top_k: int,
    max_answer_len: int,
    handle_impossible_answer: bool,
) -> list[dict]:
    """Answer spans of one (question, context) input, best first: `[{"score", "start", "end", "answer"}]`.

    As transformers' question-answering pipeline (its `select_starts_ends`, `decode_spans` and word-aligned
    `get_indices`), for a context read whole instead of in 384-token windows: softmax over the start and over
    the end logits of the context tokens and [CLS] (question, [SEP] and padding excluded); [CLS]'s start ×
    end probability is the no-answer score; span score = p_start × p_end over spans with start ≤ end <
    start + max_answer_len inside the context; the best `top_k * 2 + 10` spans are widened to whole words
    (character offsets from the fast tokenizer), spans giving the same text (case aside) add their scores,
    and the no-answer, when asked for, competes with them. Only the spans of the band are scored (L ×
    max_answer_len, not L × L: 4,096² float32 would be 64 MB per input). `logits`: (L, 2), start and end.
    """
    n = encoded.length
    allowed = encoded.sequence_ids == 1
    allowed[0] = True  # [CLS]: the no-answer
    start = np.where(allowed, logits[:n, 0].astype(np.float32), np.float32(EXCLUDED_LOGIT))
    end = np.where(allowed, logits[:n, 1].astype(np.float32), np.float32(EXCLUDED_LOGIT))
    start = np.exp(start - start.max())
    start = start / start.sum()
    end = np.exp(end - end.max())
    end = end / end.sum()
    null_score = float(start[0] * end[0])
    start[0] = end[0] = 0.0

    # scores[s, j] = p_start[s] · p_end[s + j] for spans of j + 1 tokens inside the context
    width = np.arange(max_answer_len)
    ends = np.arange(n)[:, None] + width[None, :]  # (n, max_answer_len)
    inside = (ends < n) & allowed[:, None] & allowed[np.minimum(ends, n - 1)]
    scores = np.where(inside, start[:, None] * end[np.minimum(ends, n - 1)], np.float32(0.0))
    flat = scores.ravel()
    spans = np.flatnonzero(inside.ravel())  # only these: a short input has fewer spans than candidates asked for
    candidates = min(top_k * 2 + 10, len(spans))
    if candidates < len(spans):
        spans = spans[np.argpartition(-flat[spans], candidates - 1)[:candidates]]
    best = spans[np.argsort(-flat[spans], kind="stable")]

    words = encoded.word_chars(1)
    answers: list[dict] = []
    for index in best:
        s, j = divmod(int(index), max_answer_len)
        e = s + j
        if words[s, 0] >= 0 and words[e, 0] >= 0:  # widened to the words the tokens belong to
            first, last = int(words[s, 0]), int(words[e, 1])
        else:  # a token with no word ([CLS]): its own offsets
            first, last = int(encoded.offsets[s, 0]), int(encoded.offsets[e, 1])
        text = context[first:last]
        same = next((a for a in answers if a["answer"].lower() == text.lower()), None)
        if same is not None:
            same["score"] += float(flat[index])
        else:
            answers.append({"score": float(flat[index]), "start": first, "end": last, "answer": text})
    if handle_impossible_answer:
        answers.append({"score": null_score, "start": 0, "end": 0, "answer": ""})
    return sorted(answers, key=lambda a: a["score"], reverse=True)[:top_k]


# -- token classification: transformers' TokenClassificationPipeline ----------------------------------------

AGGREGATIONS = ("none", "simple", "first", "average", "max")


def token_entities(
    logits: np.ndarray,
    encoded: SpanEncoded,
    text: str,
    id2label: dict[int, str],
    aggregation_strategy: str,
    ignore_labels: list[str],
    tokenizer: RequestTokenizer,
) -> list[dict]:
    """The labelled tokens, words or entities of one text, as transformers' token-classification pipeline
    with the same `aggregation_strategy`:

    none     every token but the special ones: `{entity, score, index, word, start, end}`
    simple   adjacent tokens whose labels continue one another (B-X then I-X …, never two B-) grouped:
             `{entity_group, score (mean), word, start, end}`
    first, average, max
             first the word pieces of a word are made one (the label of its first piece; of the mean
             of its pieces' scores; of its most confident piece), then grouped as simple

    Scores are the softmax over the labels; a piece is part of the previous word when its vocabulary string
    is longer than its text ("##" pieces) and it is not [UNK]. Entities labelled in `ignore_labels` are left
    out. `start`/`end` are character offsets in `text`. `logits`: (L, num_labels).
    """
    n = encoded.length
    scores = logits[:n].astype(np.float32)
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    scores = scores / scores.sum(axis=-1, keepdims=True)
    unknown = tokenizer.plain.token_to_id("[UNK]")
    pieces = []
    for index in np.flatnonzero(encoded.sequence_ids >= 0):
        first, last = (int(x) for x in encoded.offsets[index])
        word, ref = encoded.tokens[index], text[first:last]
        subword = len(word) != len(ref)
        if int(encoded.input_ids[index]) == unknown:
            word, subword = ref, False
        pieces.append({"word": word, "scores": scores[index], "start": first, "end": last, "index": int(index),
                       "is_subword": subword})  # fmt: skip

    if aggregation_strategy in ("none", "simple"):
        entities = []
        for piece in pieces:
            best = int(piece["scores"].argmax())
            entities.append({"entity": id2label[best], "score": float(piece["scores"][best]), "index": piece["index"],
                             "word": piece["word"], "start": piece["start"], "end": piece["end"]})  # fmt: skip
    else:
        entities = [_word_entity(group, aggregation_strategy, id2label, tokenizer) for group in _words(pieces)]
    if aggregation_strategy != "none":
        entities = [_entity_group(group, tokenizer) for group in _continuing(entities)]
    return [e for e in entities if e.get("entity", e.get("entity_group")) not in ignore_labels]


def _words(pieces: list[dict]) -> list[list[dict]]:
    words: list[list[dict]] = []
    for piece in pieces:
        if words and piece["is_subword"]:
            words[-1].append(piece)
        else:
            words.append([piece])
    return words


def _word_entity(pieces: list[dict], strategy: str, id2label: dict[int, str], tokenizer: RequestTokenizer) -> dict:
    if strategy == "first":
        scores = pieces[0]["scores"]
    elif strategy == "max":
        scores = max(pieces, key=lambda p: p["scores"].max())["scores"]
    else:  # average
        scores = np.nanmean(np.stack([p["scores"] for p in pieces]), axis=0)
    best = int(scores.argmax())
    return {
        "entity": id2label[best],
        "score": float(scores[best]),
        "word": tokenizer.tokens_to_string([p["word"] for p in pieces]),
        "start": pieces[0]["start"],
        "end": pieces[-1]["end"],
    }


def _tag(label: str) -> tuple[str, str]:
    """("B" | "I", type): a label without a B-/I- prefix continues its type, as transformers reads it."""
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label


def _continuing(entities: list[dict]) -> list[list[dict]]:
    groups: list[list[dict]] = []
    for entity in entities:
        bi, tag = _tag(entity["entity"])
        if groups and tag == _tag(groups[-1][-1]["entity"])[1] and bi != "B":
            groups[-1].append(entity)
        else:
            groups.append([entity])
    return groups


def _entity_group(entities: list[dict], tokenizer: RequestTokenizer) -> dict:
    return {
        "entity_group": entities[0]["entity"].split("-", 1)[-1],
        "score": float(np.nanmean([e["score"] for e in entities])),
        "word": tokenizer.tokens_to_string([e["word"] for e in entities]),
        "start": entities[0]["start"],
        "end": entities[-1]["end"],
    }
