# Sourced by the build scripts: which dev sets a model is built from, and the check that they are there.
#
# TRAIN_SETS: the six labelled sets that are not kept for zero-shot checks (bfcl and gorilla_huggingface are
# never trained on). DISTIL_SETS: those plus the unlabelled corpora (MIT), whose tool texts a distilled
# query encoder (the static table, the query student) also reads.
TRAIN_SETS=(apibank gorilla_torchhub metatool rotbench sealtools toollens)
DISTIL_SETS=("${TRAIN_SETS[@]}" taskbench_dailylifeapis_corpus taskbench_huggingface_corpus
             taskbench_multimedia_corpus tool2vec_aws_corpus tool2vec_numpy_corpus tool2vec_pandas_corpus)

# require_sets SCRIPT DATA SET...: exit 2, naming the first missing folder, unless every SET is in DATA.
require_sets() {
  local script="$1" data="$2" s
  shift 2
  for s in "$@"; do
    [ -d "$data/$s" ] || { echo "$script: $data/$s is missing (need the dev data beside the repo)" >&2; exit 2; }
  done
}
