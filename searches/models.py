"""Models for ideas, searches, trials, reviews, releases and workers.

None yet: they arrive with the web issue. The dashboard reads the problem registry straight
from kernels.problems, which needs no database.
"""
