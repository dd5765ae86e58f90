"""What an aggregation scope writes, by name: its tables and figures, and their sections in the report.

The workflow plans the files of every scope from these names alone, so planning does not import
the analysis (scipy) or the plotting (matplotlib); mlcampaign.analysis.tables builds the tables
and mlcampaign.analysis.plots draws the figures.
"""

# Table name: what one row is (file names tables/<name>.csv and .parquet).
TABLES = {
    "summary": "planned / executed / ok / failed / not run / valid trials per system x benchmark",
    "capability": "every planned cell with its status and failure reasons",
    "planned_trials": "every planned trial with its status and analysed metrics",
    "repeatability": "statistics of each metric per cell",
    "convergence": "fraction of trials reaching the target and epochs-to-target per cell",
    "ranking": "Valid FLOPS ranking per benchmark with intervals and rank probabilities",
    "scaling_strong": "strong scaling (fixed global batch) per cell",
    "scaling_weak": "weak scaling (fixed local batch) per cell",
}
TABLE_FORMATS = ("csv", "parquet")
# Figure name: the tables it is drawn from, in the order its drawing function takes them.
FIGURE_TABLES = {
    "capability": ("capability",),
    "repeatability": ("planned_trials",),
    "ranking": ("ranking",),
    "scaling_strong": ("scaling_strong",),
    "scaling_weak": ("scaling_weak",),
    "performance": ("scaling_strong", "scaling_weak"),
}
# Report section of each table view and figure (a figure has the name of the table it is drawn from).
REPORT_CATEGORIES = {
    "summary": "Campaign",
    "capability": "Campaign",
    "planned_trials": "Campaign",
    "repeatability": "Repeatability",
    "convergence": "Repeatability",
    "ranking": "Valid FLOPS ranking",
    "scaling_strong": "Scaling",
    "scaling_weak": "Scaling",
    "performance": "Scaling",
}
