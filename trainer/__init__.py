"""The BERT pretraining trainer (`python -m trainer`)."""

# Raised by a change that makes the same config and seed train differently (another curve of eval accuracy by
# samples), not by one that only makes it faster. The learning-curve tables (hpo/simulation/tables/) record the
# revision that made them; a table without one was made by revision 1.
#   1  until 2026-11-29
#   2  gradient accumulation weighs each micro-batch's MLM loss by its share of the step's masked tokens
CURVES_REVISION = 2
