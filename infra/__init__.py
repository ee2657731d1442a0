"""The CDK app's code: stacks (infra/stacks, which only compose) and constructs (infra/constructs),
kept under infra/ because a top-level package named `constructs` would shadow the `constructs`
library that aws-cdk-lib imports."""
