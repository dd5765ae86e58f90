"""mlcampaign: the logic of the ML benchmark campaign workflow.

Job scripts import it from the workflow checkout (scripts/ put the checkout on sys.path),
so compute nodes need no install step beyond the Python environment.
"""

__version__ = "0.1.0"
