"""The path pytest is given in the judge; the test file it runs comes from the job (`pytest_runner`), not from here."""
