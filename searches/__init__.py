"""autoweb's Django app: ideas, searches, trials, reviews, releases and the pages around them."""
