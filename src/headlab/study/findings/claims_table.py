"""Every claim the study tests, as a table for study.md: the paper's own sentence and number, the quantity computed,
its interval, the boundary, the test and what leaves it inconclusive (study.json keys in the first column)."""

from __future__ import annotations

# (study.json keys, the paper's sentence and number, quantity, interval, boundary, test, inconclusive when)
ROWS = [
    ("`guan_stability`", "Guan, Table 1: \"over 95% attention heads are clustered stably\" (94.37-96.26% over four "
     "models)", "share of heads with the same type in all 10 fits on random halves of the heads", "central 95% of "
     "21 runs of the whole procedure", "0.94 (Table 1's low end)", "range against the boundary", "the range "
     "reaches 0.94; no verdict for numbered clusters or one run"),
    ("`guan_table2_diagonal_vs_{dense,dense_vertical,vertical}_prune`", "Guan, Table 2: pruning the diagonal heads "
     "\"makes the model totally inoperative, compared with (2, 4, 5)\" (EM 4.59 vs 79.92, 73.33, 81.42)",
     "metric(prune other type) - metric(prune diagonal), paired", "paired bootstrap CI by clusters, simultaneous "
     "over Table 2's 5 orderings", "0", "CI and Holm-adjusted permutation p; the removed type also costs more "
     "than 20 random head sets of its size (rank p <= 0.05) and the ordering holds under at least half of the "
     "clustering's bootstrap fits", "the CI touches 0, the CI and p disagree, p is within 3 Monte Carlo errors of "
     "0.05, the type costs no more than the random sets, or it holds under fewer than half of the bootstrap fits"),
    ("`guan_table2_diagonal_vs_vertical_uniform`", "Guan, Table 2: uniform attention in the diagonal heads (row 9, EM "
     "1.27) against the vertical ones (row 11, EM 53.17)", "metric(uniform vertical) - metric(uniform diagonal)",
     "as above", "0", "as above", "as above"),
    ("`guan_table2_dense_vertical_uniform`", "Guan, Table 2: \"substituting the mixed type dense&vertical (10) has a "
     "significant accuracy loss\" (EM 9.13 vs 74.68 for dense, row 8)", "metric(uniform dense) - metric(uniform "
     "dense&vertical)", "as above", "0", "as above", "as above"),
    ("`guan_table2_vertical_prune_cheap`", "Guan, Table 2: pruning all vertical heads \"has less than 1.5% accuracy "
     "loss\" (EM 82.85 to 81.42)", "(metric(prune vertical) - baseline) / (baseline - chance)", "paired bootstrap "
     "CI by clusters, simultaneous over the 2 bounded costs", "-1.5 / 82.85 = -0.0181 (F1: -1.5 / 89.68)", "CI "
     "against the boundary, with the change's Holm-adjusted permutation p; under at least half of the bootstrap "
     "fits too", "the CI reaches the boundary, it and p disagree about a change, or it holds under fewer than half "
     "of the bootstrap fits"),
    ("`guan_table2_dense_uniform_cheap`", "Guan, Table 2: uniform attention in the dense heads \"results in accuracy "
     "loss of less than 10%\" (EM 82.85 to 74.68)", "(metric(uniform dense) - baseline) / (baseline - chance)",
     "as above", "-10 / 82.85 = -0.1207 (F1: -10 / 89.68)", "as above", "as above"),
    ("`guan_table3[_renormalized]_diagonal_intra`", "Guan, Table 3: removing the diagonal heads' intra-sentence "
     "attention (12, EM 16.96) against their inter-sentence attention (13, EM 82.29)", "metric(drop_inter diagonal) "
     "- metric(drop_intra diagonal)", "paired bootstrap CI by clusters, simultaneous over Table 3's 8 orderings "
     "(with and without renormalising)", "0", "CI and Holm-adjusted permutation p", "as for Table 2"),
    ("`guan_table3[_renormalized]_dense_vertical_inter`", "Guan, Table 3: the dense&vertical heads' inter-sentence "
     "attention (15, EM 77.95) against their intra-sentence attention (14, EM 80.28)", "metric(drop_intra "
     "dense&vertical) - metric(drop_inter dense&vertical); attention to or from [CLS] and [SEP] is neither intra "
     "nor inter (docs/plans.md)", "as above", "0", "as above", "as above"),
    ("`guan_table3[_renormalized]_diagonal_local_only`", "Guan, Table 3: \"even with only diagonal head handling "
     "intra-sentence information (16), the model has a decent accuracy of 71.80%\" (against 14.83 with only "
     "dense&vertical, 18)", "metric(row 16) - metric(row 18)", "as above", "0", "as above", "as above"),
    ("`guan_table3[_renormalized]_dense_vertical_global_only`", "Guan, Table 3: \"with dense&vertical attending other "
     "sentences solely (19), the model reaches an accuracy of 75.54%\" (against 10.11 with only diagonal, 17)",
     "metric(row 19) - metric(row 17)", "as above", "0", "as above", "as above"),
    ("`guan_finetuning_later_layers`", "Guan, Section 4 / Figure 4: \"some heads in the highest layers also change\" "
     "with fine-tuning", "share of heads whose type changed, later half of the layers minus earlier half",
     "Newcombe's interval", "0", "interval against the boundary", "the interval reaches 0; not tested for numbered "
     "clusters"),
    ("`clark_relations`", "Clark, Section 4: single heads for direct objects, determiners, ... beat the best fixed "
     "offset", "relations whose best head beats the offset (max-T test allowing for the choice of head, Holm "
     "across relations)", "the count; sentences resampled", "at least one relation (does not hold: every "
     "relation's CI below +5 points)", "count", "no relation beats its offset, yet some could by 5 points"),
    ("`clark_overall`", "Clark, Section 4 / Table 1: no single head does syntax well overall", "best head on all "
     "words minus the best offset, accuracy points", "simultaneous bootstrap CI over heads, by sentences", "+10 "
     "points (below)",
     "CI against the boundary", "the CI reaches +10"),
    ("`michel_single_heads`", "Michel, Section 3: most heads can be removed one at a time without a significant "
     "loss", "heads whose CI lies above -margin (removable) and below it (costly)", "the sweep's CIs (simultaneous "
     "over the heads in the default study; a head that changed nothing: the Clopper-Pearson bound of that many "
     "unchanged units)", "more than half removable (`study.findings.margin`, 1 point)",
     "equivalence count", "neither more than half removable nor half or more costly"),
    ("`michel_importance_pruning`", "Michel, Section 5 / Figure 4: pruning by importance keeps the score longer than "
     "random pruning", "mean share of the baseline kept over the curve's steps, importance order", "rank among R "
     "random orders: p = (1 + #{random >= importance}) / (R + 1), of these examples; the area difference's paired "
     "bootstrap CI by clusters, of other examples", "p <= 0.05 (needs R >= 19) and the CI above 0",
     "exact Monte Carlo rank test and the CI (the other tail of both: does not hold)", "the rank is in the middle, "
     "R < 19, or the CI reaches 0"),
    ("`pande_local_syntactic`", "Pande, question 1: \"overlap between local and syntactic heads is very high, ~42% to "
     "89%\"", "odds ratio of local and syntactic roles over the heads (a syntactic role beyond the head's fixed-offset "
     "pattern)", "conditional-MLE CI", "1", "CI against the "
     "boundary", "the CI reaches 1"),
    ("`pande_syntactic_layers`", "Pande, question 2: \"at least 3 syntactic heads in each layer (except a very few "
     "exceptions)\"", "layers with fewer than a quarter of their heads syntactic (3 of 12)", "the count, with the "
     "roles corrected across heads and without", "at most a tenth of the layers", "count", "the corrected count "
     "fails and the uncorrected one holds"),
    ("`voita_most_heads_pruned`", "Voita (pruning by L0 gates): most heads can be pruned at a small cost (the gates "
     "stage, when study.stages names it)", "the main metric's change with the heads each L0 penalty closes pruned, "
     "among the penalties that close more than half", "paired bootstrap CI by clusters, simultaneous over those "
     "penalties (under 10 units changed: widened by the Clopper-Pearson bound of what more could hide)",
     "-margin (`study.findings.margin`, 1 point)", "equivalence side: one penalty's CI above the "
     "boundary holds, every one below it does not when the one pruning the fewest prunes at most 60% of the heads",
     "no penalty's CI clears the boundary and not all fall below, or the grid skips from half the heads to over 60% "
     "(the penalty to add is named); not tested when none prunes half"),
    ("`chg_irrelevant_removable`", "Nam (causal head gating, validated by ablation): the heads it calls irrelevant "
     "can be removed together", "the main metric's change with the irrelevant heads pruned together (their share and "
     "the classes' stability stated)", "paired bootstrap CI by clusters (zero width: as Voita's)",
     "-margin", "CI against the boundary; a "
     "\"no loss\" counts only for a class of at least a tenth of the heads, at least 80% of them irrelevant in every "
     "one of two or more fits", "the CI reaches the boundary, or the class is too small or not reproducible"),
    ("`li_janson_optimal_below_mean`", "Li & Janson: optimal ablation's gap is below mean ablation's (held-out data)",
     "per head, loss(optimal) - loss(mean), paired", "paired bootstrap CI; permutation p Holm-adjusted across the "
     "heads", "0, per head", "a head is shown below (above) when its Holm p < 0.05 and its CI agree; more than half "
     "shown below and none above holds, one shown above does not", "no head above but half or fewer shown below "
     "(the others moved too little to tell), a head above decided only within 3 Monte Carlo errors, or too few "
     "permutations for any head to pass Holm's correction"),
]
HEADER = ("claim (study.json)", "the paper's sentence and number", "quantity", "interval", "boundary", "test",
          "inconclusive when")


def claims_table() -> str:
    """The markdown table of ``ROWS``."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in ROWS]
    return "\n".join(lines)
