MORE: dict = {}
