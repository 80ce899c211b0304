return finish(key, rec, now, NULL, lapsed, before)
