"""Operations around runs: images (names, lock, build/push/pull), doctor, share, validate, the demo and the reliability report."""
