-- PLACEHOLDER on the job-control branch only: version 4 belongs to the dispatch branch
-- (issue 16, H1). Migrations must be numbered without gaps, so this empty file stands in for
-- it until that branch is merged; the integrator deletes this file then.
SELECT 1;
