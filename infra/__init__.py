"""The CDK app's code: the card's stacks/ and constructs/ live here as infra/stacks and
infra/constructs, because a top-level package named `constructs` would shadow the `constructs`
library that aws-cdk-lib imports."""
