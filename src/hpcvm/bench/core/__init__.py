"""bench/core: the Suite protocol, metrics and the launch every suite shares."""
