-- The central key a call through a central was made with (its id and name, never its
-- secret), as the central said it in x-fitbox-central-key: believed only on a request made
-- with this box's own key, which the box handed its central alone (server/manage/joining.py
-- central_key_of). NULL: a call made to the box itself, or by a caller the central admitted
-- without a key (its own host).
ALTER TABLE call_log ADD COLUMN central_key TEXT;
ALTER TABLE call_log ADD COLUMN central_key_name TEXT;
