//! The rules, by the names Confluent Schema Registry gives them, and which are compatible.

/// A kind of schema change. Its name (`TYPE_CHANGED`, ...) is stable: tools may match on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Rule {
    /// `ID_CHANGED` (compatible).
    IdChanged,
    /// `DESCRIPTION_CHANGED` (compatible).
    DescriptionChanged,
    /// `TITLE_CHANGED` (compatible).
    TitleChanged,
    /// `DEFAULT_CHANGED` (compatible).
    DefaultChanged,
    /// `SCHEMA_REMOVED` (compatible).
    SchemaRemoved,
    /// `TYPE_EXTENDED` (compatible).
    TypeExtended,
    /// `MAX_LENGTH_INCREASED` (compatible).
    MaxLengthIncreased,
    /// `MAX_LENGTH_REMOVED` (compatible).
    MaxLengthRemoved,
    /// `MIN_LENGTH_DECREASED` (compatible).
    MinLengthDecreased,
    /// `MIN_LENGTH_REMOVED` (compatible).
    MinLengthRemoved,
    /// `PATTERN_REMOVED` (compatible).
    PatternRemoved,
    /// `MAXIMUM_INCREASED` (compatible).
    MaximumIncreased,
    /// `MAXIMUM_REMOVED` (compatible).
    MaximumRemoved,
    /// `MINIMUM_DECREASED` (compatible).
    MinimumDecreased,
    /// `MINIMUM_REMOVED` (compatible).
    MinimumRemoved,
    /// `EXCLUSIVE_MAXIMUM_INCREASED` (compatible).
    ExclusiveMaximumIncreased,
    /// `EXCLUSIVE_MAXIMUM_REMOVED` (compatible).
    ExclusiveMaximumRemoved,
    /// `EXCLUSIVE_MINIMUM_DECREASED` (compatible).
    ExclusiveMinimumDecreased,
    /// `EXCLUSIVE_MINIMUM_REMOVED` (compatible).
    ExclusiveMinimumRemoved,
    /// `MULTIPLE_OF_REDUCED` (compatible).
    MultipleOfReduced,
    /// `MULTIPLE_OF_REMOVED` (compatible).
    MultipleOfRemoved,
    /// `REQUIRED_ATTRIBUTE_WITH_DEFAULT_ADDED` (compatible).
    RequiredAttributeWithDefaultAdded,
    /// `REQUIRED_ATTRIBUTE_REMOVED` (compatible).
    RequiredAttributeRemoved,
    /// `DEPENDENCY_ARRAY_NARROWED` (compatible).
    DependencyArrayNarrowed,
    /// `DEPENDENCY_ARRAY_REMOVED` (compatible).
    DependencyArrayRemoved,
    /// `DEPENDENCY_SCHEMA_REMOVED` (compatible).
    DependencySchemaRemoved,
    /// `MAX_PROPERTIES_INCREASED` (compatible).
    MaxPropertiesIncreased,
    /// `MAX_PROPERTIES_REMOVED` (compatible).
    MaxPropertiesRemoved,
    /// `MIN_PROPERTIES_DECREASED` (compatible).
    MinPropertiesDecreased,
    /// `MIN_PROPERTIES_REMOVED` (compatible).
    MinPropertiesRemoved,
    /// `ADDITIONAL_PROPERTIES_ADDED` (compatible).
    AdditionalPropertiesAdded,
    /// `ADDITIONAL_PROPERTIES_EXTENDED` (compatible).
    AdditionalPropertiesExtended,
    /// `PROPERTY_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL` (compatible).
    PropertyWithEmptySchemaAddedToOpenContentModel,
    /// `REQUIRED_PROPERTY_WITH_DEFAULT_ADDED_TO_UNOPEN_CONTENT_MODEL` (compatible).
    RequiredPropertyWithDefaultAddedToUnopenContentModel,
    /// `OPTIONAL_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL` (compatible).
    OptionalPropertyAddedToUnopenContentModel,
    /// `PROPERTY_WITH_FALSE_REMOVED_FROM_CLOSED_CONTENT_MODEL` (compatible).
    PropertyWithFalseRemovedFromClosedContentModel,
    /// `PROPERTY_REMOVED_FROM_OPEN_CONTENT_MODEL` (compatible).
    PropertyRemovedFromOpenContentModel,
    /// `PROPERTY_ADDED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL` (compatible).
    PropertyAddedIsCoveredByPartiallyOpenContentModel,
    /// `PROPERTY_REMOVED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL` (compatible).
    PropertyRemovedIsCoveredByPartiallyOpenContentModel,
    /// `MAX_ITEMS_INCREASED` (compatible).
    MaxItemsIncreased,
    /// `MAX_ITEMS_REMOVED` (compatible).
    MaxItemsRemoved,
    /// `MIN_ITEMS_DECREASED` (compatible).
    MinItemsDecreased,
    /// `MIN_ITEMS_REMOVED` (compatible).
    MinItemsRemoved,
    /// `UNIQUE_ITEMS_REMOVED` (compatible).
    UniqueItemsRemoved,
    /// `ADDITIONAL_ITEMS_ADDED` (compatible).
    AdditionalItemsAdded,
    /// `ADDITIONAL_ITEMS_EXTENDED` (compatible).
    AdditionalItemsExtended,
    /// `ITEM_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL` (compatible).
    ItemWithEmptySchemaAddedToOpenContentModel,
    /// `ITEM_ADDED_TO_CLOSED_CONTENT_MODEL` (compatible).
    ItemAddedToClosedContentModel,
    /// `ITEM_WITH_FALSE_REMOVED_FROM_CLOSED_CONTENT_MODEL` (compatible).
    ItemWithFalseRemovedFromClosedContentModel,
    /// `ITEM_REMOVED_FROM_OPEN_CONTENT_MODEL` (compatible).
    ItemRemovedFromOpenContentModel,
    /// `ITEM_ADDED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL` (compatible).
    ItemAddedIsCoveredByPartiallyOpenContentModel,
    /// `ITEM_REMOVED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL` (compatible).
    ItemRemovedIsCoveredByPartiallyOpenContentModel,
    /// `ENUM_ARRAY_EXTENDED` (compatible).
    EnumArrayExtended,
    /// `COMBINED_TYPE_EXTENDED` (compatible).
    CombinedTypeExtended,
    /// `PRODUCT_TYPE_NARROWED` (compatible).
    ProductTypeNarrowed,
    /// `SUM_TYPE_EXTENDED` (compatible).
    SumTypeExtended,
    /// `NOT_TYPE_NARROWED` (compatible).
    NotTypeNarrowed,
    /// `UNEVALUATED_ITEMS_ADDED` (compatible).
    UnevaluatedItemsAdded,
    /// `UNEVALUATED_ITEMS_EXTENDED` (compatible).
    UnevaluatedItemsExtended,
    /// `UNEVALUATED_PROPERTIES_ADDED` (compatible).
    UnevaluatedPropertiesAdded,
    /// `UNEVALUATED_PROPERTIES_EXTENDED` (compatible).
    UnevaluatedPropertiesExtended,
    /// `MAX_CONTAINS_INCREASED` (compatible).
    MaxContainsIncreased,
    /// `MAX_CONTAINS_REMOVED` (compatible).
    MaxContainsRemoved,
    /// `MIN_CONTAINS_DECREASED` (compatible).
    MinContainsDecreased,
    /// `MIN_CONTAINS_REMOVED` (compatible).
    MinContainsRemoved,
    /// `SCHEMA_ADDED` (breaks readers).
    SchemaAdded,
    /// `TYPE_CHANGED` (breaks readers).
    TypeChanged,
    /// `TYPE_NARROWED` (breaks readers).
    TypeNarrowed,
    /// `MAX_LENGTH_ADDED` (breaks readers).
    MaxLengthAdded,
    /// `MAX_LENGTH_DECREASED` (breaks readers).
    MaxLengthDecreased,
    /// `MIN_LENGTH_ADDED` (breaks readers).
    MinLengthAdded,
    /// `MIN_LENGTH_INCREASED` (breaks readers).
    MinLengthIncreased,
    /// `PATTERN_ADDED` (breaks readers).
    PatternAdded,
    /// `PATTERN_CHANGED` (breaks readers).
    PatternChanged,
    /// `MAXIMUM_ADDED` (breaks readers).
    MaximumAdded,
    /// `MAXIMUM_DECREASED` (breaks readers).
    MaximumDecreased,
    /// `MINIMUM_ADDED` (breaks readers).
    MinimumAdded,
    /// `MINIMUM_INCREASED` (breaks readers).
    MinimumIncreased,
    /// `EXCLUSIVE_MAXIMUM_ADDED` (breaks readers).
    ExclusiveMaximumAdded,
    /// `EXCLUSIVE_MAXIMUM_DECREASED` (breaks readers).
    ExclusiveMaximumDecreased,
    /// `EXCLUSIVE_MINIMUM_ADDED` (breaks readers).
    ExclusiveMinimumAdded,
    /// `EXCLUSIVE_MINIMUM_INCREASED` (breaks readers).
    ExclusiveMinimumIncreased,
    /// `MULTIPLE_OF_ADDED` (breaks readers).
    MultipleOfAdded,
    /// `MULTIPLE_OF_EXPANDED` (breaks readers).
    MultipleOfExpanded,
    /// `MULTIPLE_OF_CHANGED` (breaks readers).
    MultipleOfChanged,
    /// `REQUIRED_ATTRIBUTE_ADDED` (breaks readers).
    RequiredAttributeAdded,
    /// `DEPENDENCY_ARRAY_ADDED` (breaks readers).
    DependencyArrayAdded,
    /// `DEPENDENCY_ARRAY_EXTENDED` (breaks readers).
    DependencyArrayExtended,
    /// `DEPENDENCY_ARRAY_CHANGED` (breaks readers).
    DependencyArrayChanged,
    /// `DEPENDENCY_SCHEMA_ADDED` (breaks readers).
    DependencySchemaAdded,
    /// `MAX_PROPERTIES_ADDED` (breaks readers).
    MaxPropertiesAdded,
    /// `MAX_PROPERTIES_DECREASED` (breaks readers).
    MaxPropertiesDecreased,
    /// `MIN_PROPERTIES_ADDED` (breaks readers).
    MinPropertiesAdded,
    /// `MIN_PROPERTIES_INCREASED` (breaks readers).
    MinPropertiesIncreased,
    /// `ADDITIONAL_PROPERTIES_REMOVED` (breaks readers).
    AdditionalPropertiesRemoved,
    /// `ADDITIONAL_PROPERTIES_NARROWED` (breaks readers).
    AdditionalPropertiesNarrowed,
    /// `PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL` (breaks readers).
    PropertyAddedToOpenContentModel,
    /// `REQUIRED_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL` (breaks readers).
    RequiredPropertyAddedToUnopenContentModel,
    /// `PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL` (breaks readers).
    PropertyRemovedFromClosedContentModel,
    /// `PROPERTY_ADDED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL` (breaks readers).
    PropertyAddedNotCoveredByPartiallyOpenContentModel,
    /// `PROPERTY_REMOVED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL` (breaks readers).
    PropertyRemovedNotCoveredByPartiallyOpenContentModel,
    /// `MAX_ITEMS_ADDED` (breaks readers).
    MaxItemsAdded,
    /// `MAX_ITEMS_DECREASED` (breaks readers).
    MaxItemsDecreased,
    /// `MIN_ITEMS_ADDED` (breaks readers).
    MinItemsAdded,
    /// `MIN_ITEMS_INCREASED` (breaks readers).
    MinItemsIncreased,
    /// `UNIQUE_ITEMS_ADDED` (breaks readers).
    UniqueItemsAdded,
    /// `ADDITIONAL_ITEMS_REMOVED` (breaks readers).
    AdditionalItemsRemoved,
    /// `ADDITIONAL_ITEMS_NARROWED` (breaks readers).
    AdditionalItemsNarrowed,
    /// `ITEM_ADDED_TO_OPEN_CONTENT_MODEL` (breaks readers).
    ItemAddedToOpenContentModel,
    /// `ITEM_REMOVED_FROM_CLOSED_CONTENT_MODEL` (breaks readers).
    ItemRemovedFromClosedContentModel,
    /// `ITEM_ADDED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL` (breaks readers).
    ItemAddedNotCoveredByPartiallyOpenContentModel,
    /// `ITEM_REMOVED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL` (breaks readers).
    ItemRemovedNotCoveredByPartiallyOpenContentModel,
    /// `ENUM_ARRAY_NARROWED` (breaks readers).
    EnumArrayNarrowed,
    /// `ENUM_ARRAY_CHANGED` (breaks readers).
    EnumArrayChanged,
    /// `COMBINED_TYPE_CHANGED` (breaks readers).
    CombinedTypeChanged,
    /// `PRODUCT_TYPE_EXTENDED` (breaks readers).
    ProductTypeExtended,
    /// `SUM_TYPE_NARROWED` (breaks readers).
    SumTypeNarrowed,
    /// `COMBINED_TYPE_SUBSCHEMAS_CHANGED` (breaks readers).
    CombinedTypeSubschemasChanged,
    /// `NOT_TYPE_EXTENDED` (breaks readers).
    NotTypeExtended,
    /// `UNEVALUATED_ITEMS_REMOVED` (breaks readers).
    UnevaluatedItemsRemoved,
    /// `UNEVALUATED_ITEMS_NARROWED` (breaks readers).
    UnevaluatedItemsNarrowed,
    /// `UNEVALUATED_PROPERTIES_REMOVED` (breaks readers).
    UnevaluatedPropertiesRemoved,
    /// `UNEVALUATED_PROPERTIES_NARROWED` (breaks readers).
    UnevaluatedPropertiesNarrowed,
    /// `MAX_CONTAINS_ADDED` (breaks readers).
    MaxContainsAdded,
    /// `MAX_CONTAINS_DECREASED` (breaks readers).
    MaxContainsDecreased,
    /// `MIN_CONTAINS_ADDED` (breaks readers).
    MinContainsAdded,
    /// `MIN_CONTAINS_INCREASED` (breaks readers).
    MinContainsIncreased,
}

impl Rule {
    /// The stable name, e.g. `PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL`.
    pub fn name(self) -> &'static str {
        match self {
            Rule::IdChanged => "ID_CHANGED",
            Rule::DescriptionChanged => "DESCRIPTION_CHANGED",
            Rule::TitleChanged => "TITLE_CHANGED",
            Rule::DefaultChanged => "DEFAULT_CHANGED",
            Rule::SchemaRemoved => "SCHEMA_REMOVED",
            Rule::TypeExtended => "TYPE_EXTENDED",
            Rule::MaxLengthIncreased => "MAX_LENGTH_INCREASED",
            Rule::MaxLengthRemoved => "MAX_LENGTH_REMOVED",
            Rule::MinLengthDecreased => "MIN_LENGTH_DECREASED",
            Rule::MinLengthRemoved => "MIN_LENGTH_REMOVED",
            Rule::PatternRemoved => "PATTERN_REMOVED",
            Rule::MaximumIncreased => "MAXIMUM_INCREASED",
            Rule::MaximumRemoved => "MAXIMUM_REMOVED",
            Rule::MinimumDecreased => "MINIMUM_DECREASED",
            Rule::MinimumRemoved => "MINIMUM_REMOVED",
            Rule::ExclusiveMaximumIncreased => "EXCLUSIVE_MAXIMUM_INCREASED",
            Rule::ExclusiveMaximumRemoved => "EXCLUSIVE_MAXIMUM_REMOVED",
            Rule::ExclusiveMinimumDecreased => "EXCLUSIVE_MINIMUM_DECREASED",
            Rule::ExclusiveMinimumRemoved => "EXCLUSIVE_MINIMUM_REMOVED",
            Rule::MultipleOfReduced => "MULTIPLE_OF_REDUCED",
            Rule::MultipleOfRemoved => "MULTIPLE_OF_REMOVED",
            Rule::RequiredAttributeWithDefaultAdded => "REQUIRED_ATTRIBUTE_WITH_DEFAULT_ADDED",
            Rule::RequiredAttributeRemoved => "REQUIRED_ATTRIBUTE_REMOVED",
            Rule::DependencyArrayNarrowed => "DEPENDENCY_ARRAY_NARROWED",
            Rule::DependencyArrayRemoved => "DEPENDENCY_ARRAY_REMOVED",
            Rule::DependencySchemaRemoved => "DEPENDENCY_SCHEMA_REMOVED",
            Rule::MaxPropertiesIncreased => "MAX_PROPERTIES_INCREASED",
            Rule::MaxPropertiesRemoved => "MAX_PROPERTIES_REMOVED",
            Rule::MinPropertiesDecreased => "MIN_PROPERTIES_DECREASED",
            Rule::MinPropertiesRemoved => "MIN_PROPERTIES_REMOVED",
            Rule::AdditionalPropertiesAdded => "ADDITIONAL_PROPERTIES_ADDED",
            Rule::AdditionalPropertiesExtended => "ADDITIONAL_PROPERTIES_EXTENDED",
            Rule::PropertyWithEmptySchemaAddedToOpenContentModel => {
                "PROPERTY_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL"
            }
            Rule::RequiredPropertyWithDefaultAddedToUnopenContentModel => {
                "REQUIRED_PROPERTY_WITH_DEFAULT_ADDED_TO_UNOPEN_CONTENT_MODEL"
            }
            Rule::OptionalPropertyAddedToUnopenContentModel => {
                "OPTIONAL_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL"
            }
            Rule::PropertyWithFalseRemovedFromClosedContentModel => {
                "PROPERTY_WITH_FALSE_REMOVED_FROM_CLOSED_CONTENT_MODEL"
            }
            Rule::PropertyRemovedFromOpenContentModel => "PROPERTY_REMOVED_FROM_OPEN_CONTENT_MODEL",
            Rule::PropertyAddedIsCoveredByPartiallyOpenContentModel => {
                "PROPERTY_ADDED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL"
            }
            Rule::PropertyRemovedIsCoveredByPartiallyOpenContentModel => {
                "PROPERTY_REMOVED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL"
            }
            Rule::MaxItemsIncreased => "MAX_ITEMS_INCREASED",
            Rule::MaxItemsRemoved => "MAX_ITEMS_REMOVED",
            Rule::MinItemsDecreased => "MIN_ITEMS_DECREASED",
            Rule::MinItemsRemoved => "MIN_ITEMS_REMOVED",
            Rule::UniqueItemsRemoved => "UNIQUE_ITEMS_REMOVED",
            Rule::AdditionalItemsAdded => "ADDITIONAL_ITEMS_ADDED",
            Rule::AdditionalItemsExtended => "ADDITIONAL_ITEMS_EXTENDED",
            Rule::ItemWithEmptySchemaAddedToOpenContentModel => {
                "ITEM_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL"
            }
            Rule::ItemAddedToClosedContentModel => "ITEM_ADDED_TO_CLOSED_CONTENT_MODEL",
            Rule::ItemWithFalseRemovedFromClosedContentModel => {
                "ITEM_WITH_FALSE_REMOVED_FROM_CLOSED_CONTENT_MODEL"
            }
            Rule::ItemRemovedFromOpenContentModel => "ITEM_REMOVED_FROM_OPEN_CONTENT_MODEL",
            Rule::ItemAddedIsCoveredByPartiallyOpenContentModel => {
                "ITEM_ADDED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL"
            }
            Rule::ItemRemovedIsCoveredByPartiallyOpenContentModel => {
                "ITEM_REMOVED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL"
            }
            Rule::EnumArrayExtended => "ENUM_ARRAY_EXTENDED",
            Rule::CombinedTypeExtended => "COMBINED_TYPE_EXTENDED",
            Rule::ProductTypeNarrowed => "PRODUCT_TYPE_NARROWED",
            Rule::SumTypeExtended => "SUM_TYPE_EXTENDED",
            Rule::NotTypeNarrowed => "NOT_TYPE_NARROWED",
            Rule::UnevaluatedItemsAdded => "UNEVALUATED_ITEMS_ADDED",
            Rule::UnevaluatedItemsExtended => "UNEVALUATED_ITEMS_EXTENDED",
            Rule::UnevaluatedPropertiesAdded => "UNEVALUATED_PROPERTIES_ADDED",
            Rule::UnevaluatedPropertiesExtended => "UNEVALUATED_PROPERTIES_EXTENDED",
            Rule::MaxContainsIncreased => "MAX_CONTAINS_INCREASED",
            Rule::MaxContainsRemoved => "MAX_CONTAINS_REMOVED",
            Rule::MinContainsDecreased => "MIN_CONTAINS_DECREASED",
            Rule::MinContainsRemoved => "MIN_CONTAINS_REMOVED",
            Rule::SchemaAdded => "SCHEMA_ADDED",
            Rule::TypeChanged => "TYPE_CHANGED",
            Rule::TypeNarrowed => "TYPE_NARROWED",
            Rule::MaxLengthAdded => "MAX_LENGTH_ADDED",
            Rule::MaxLengthDecreased => "MAX_LENGTH_DECREASED",
            Rule::MinLengthAdded => "MIN_LENGTH_ADDED",
            Rule::MinLengthIncreased => "MIN_LENGTH_INCREASED",
            Rule::PatternAdded => "PATTERN_ADDED",
            Rule::PatternChanged => "PATTERN_CHANGED",
            Rule::MaximumAdded => "MAXIMUM_ADDED",
            Rule::MaximumDecreased => "MAXIMUM_DECREASED",
            Rule::MinimumAdded => "MINIMUM_ADDED",
            Rule::MinimumIncreased => "MINIMUM_INCREASED",
            Rule::ExclusiveMaximumAdded => "EXCLUSIVE_MAXIMUM_ADDED",
            Rule::ExclusiveMaximumDecreased => "EXCLUSIVE_MAXIMUM_DECREASED",
            Rule::ExclusiveMinimumAdded => "EXCLUSIVE_MINIMUM_ADDED",
            Rule::ExclusiveMinimumIncreased => "EXCLUSIVE_MINIMUM_INCREASED",
            Rule::MultipleOfAdded => "MULTIPLE_OF_ADDED",
            Rule::MultipleOfExpanded => "MULTIPLE_OF_EXPANDED",
            Rule::MultipleOfChanged => "MULTIPLE_OF_CHANGED",
            Rule::RequiredAttributeAdded => "REQUIRED_ATTRIBUTE_ADDED",
            Rule::DependencyArrayAdded => "DEPENDENCY_ARRAY_ADDED",
            Rule::DependencyArrayExtended => "DEPENDENCY_ARRAY_EXTENDED",
            Rule::DependencyArrayChanged => "DEPENDENCY_ARRAY_CHANGED",
            Rule::DependencySchemaAdded => "DEPENDENCY_SCHEMA_ADDED",
            Rule::MaxPropertiesAdded => "MAX_PROPERTIES_ADDED",
            Rule::MaxPropertiesDecreased => "MAX_PROPERTIES_DECREASED",
            Rule::MinPropertiesAdded => "MIN_PROPERTIES_ADDED",
            Rule::MinPropertiesIncreased => "MIN_PROPERTIES_INCREASED",
            Rule::AdditionalPropertiesRemoved => "ADDITIONAL_PROPERTIES_REMOVED",
            Rule::AdditionalPropertiesNarrowed => "ADDITIONAL_PROPERTIES_NARROWED",
            Rule::PropertyAddedToOpenContentModel => "PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL",
            Rule::RequiredPropertyAddedToUnopenContentModel => {
                "REQUIRED_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL"
            }
            Rule::PropertyRemovedFromClosedContentModel => {
                "PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL"
            }
            Rule::PropertyAddedNotCoveredByPartiallyOpenContentModel => {
                "PROPERTY_ADDED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL"
            }
            Rule::PropertyRemovedNotCoveredByPartiallyOpenContentModel => {
                "PROPERTY_REMOVED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL"
            }
            Rule::MaxItemsAdded => "MAX_ITEMS_ADDED",
            Rule::MaxItemsDecreased => "MAX_ITEMS_DECREASED",
            Rule::MinItemsAdded => "MIN_ITEMS_ADDED",
            Rule::MinItemsIncreased => "MIN_ITEMS_INCREASED",
            Rule::UniqueItemsAdded => "UNIQUE_ITEMS_ADDED",
            Rule::AdditionalItemsRemoved => "ADDITIONAL_ITEMS_REMOVED",
            Rule::AdditionalItemsNarrowed => "ADDITIONAL_ITEMS_NARROWED",
            Rule::ItemAddedToOpenContentModel => "ITEM_ADDED_TO_OPEN_CONTENT_MODEL",
            Rule::ItemRemovedFromClosedContentModel => "ITEM_REMOVED_FROM_CLOSED_CONTENT_MODEL",
            Rule::ItemAddedNotCoveredByPartiallyOpenContentModel => {
                "ITEM_ADDED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL"
            }
            Rule::ItemRemovedNotCoveredByPartiallyOpenContentModel => {
                "ITEM_REMOVED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL"
            }
            Rule::EnumArrayNarrowed => "ENUM_ARRAY_NARROWED",
            Rule::EnumArrayChanged => "ENUM_ARRAY_CHANGED",
            Rule::CombinedTypeChanged => "COMBINED_TYPE_CHANGED",
            Rule::ProductTypeExtended => "PRODUCT_TYPE_EXTENDED",
            Rule::SumTypeNarrowed => "SUM_TYPE_NARROWED",
            Rule::CombinedTypeSubschemasChanged => "COMBINED_TYPE_SUBSCHEMAS_CHANGED",
            Rule::NotTypeExtended => "NOT_TYPE_EXTENDED",
            Rule::UnevaluatedItemsRemoved => "UNEVALUATED_ITEMS_REMOVED",
            Rule::UnevaluatedItemsNarrowed => "UNEVALUATED_ITEMS_NARROWED",
            Rule::UnevaluatedPropertiesRemoved => "UNEVALUATED_PROPERTIES_REMOVED",
            Rule::UnevaluatedPropertiesNarrowed => "UNEVALUATED_PROPERTIES_NARROWED",
            Rule::MaxContainsAdded => "MAX_CONTAINS_ADDED",
            Rule::MaxContainsDecreased => "MAX_CONTAINS_DECREASED",
            Rule::MinContainsAdded => "MIN_CONTAINS_ADDED",
            Rule::MinContainsIncreased => "MIN_CONTAINS_INCREASED",
        }
    }

    /// Whether a reader on the new schema still reads data written with the old one.
    pub fn is_compatible(self) -> bool {
        matches!(
            self,
            Rule::IdChanged
                | Rule::DescriptionChanged
                | Rule::TitleChanged
                | Rule::DefaultChanged
                | Rule::SchemaRemoved
                | Rule::TypeExtended
                | Rule::MaxLengthIncreased
                | Rule::MaxLengthRemoved
                | Rule::MinLengthDecreased
                | Rule::MinLengthRemoved
                | Rule::PatternRemoved
                | Rule::MaximumIncreased
                | Rule::MaximumRemoved
                | Rule::MinimumDecreased
                | Rule::MinimumRemoved
                | Rule::ExclusiveMaximumIncreased
                | Rule::ExclusiveMaximumRemoved
                | Rule::ExclusiveMinimumDecreased
                | Rule::ExclusiveMinimumRemoved
                | Rule::MultipleOfReduced
                | Rule::MultipleOfRemoved
                | Rule::RequiredAttributeWithDefaultAdded
                | Rule::RequiredAttributeRemoved
                | Rule::DependencyArrayNarrowed
                | Rule::DependencyArrayRemoved
                | Rule::DependencySchemaRemoved
                | Rule::MaxPropertiesIncreased
                | Rule::MaxPropertiesRemoved
                | Rule::MinPropertiesDecreased
                | Rule::MinPropertiesRemoved
                | Rule::AdditionalPropertiesAdded
                | Rule::AdditionalPropertiesExtended
                | Rule::PropertyWithEmptySchemaAddedToOpenContentModel
                | Rule::RequiredPropertyWithDefaultAddedToUnopenContentModel
                | Rule::OptionalPropertyAddedToUnopenContentModel
                | Rule::PropertyWithFalseRemovedFromClosedContentModel
                | Rule::PropertyRemovedFromOpenContentModel
                | Rule::PropertyAddedIsCoveredByPartiallyOpenContentModel
                | Rule::PropertyRemovedIsCoveredByPartiallyOpenContentModel
                | Rule::MaxItemsIncreased
                | Rule::MaxItemsRemoved
                | Rule::MinItemsDecreased
                | Rule::MinItemsRemoved
                | Rule::UniqueItemsRemoved
                | Rule::AdditionalItemsAdded
                | Rule::AdditionalItemsExtended
                | Rule::ItemWithEmptySchemaAddedToOpenContentModel
                | Rule::ItemAddedToClosedContentModel
                | Rule::ItemWithFalseRemovedFromClosedContentModel
                | Rule::ItemRemovedFromOpenContentModel
                | Rule::ItemAddedIsCoveredByPartiallyOpenContentModel
                | Rule::ItemRemovedIsCoveredByPartiallyOpenContentModel
                | Rule::EnumArrayExtended
                | Rule::CombinedTypeExtended
                | Rule::ProductTypeNarrowed
                | Rule::SumTypeExtended
                | Rule::NotTypeNarrowed
                | Rule::UnevaluatedItemsAdded
                | Rule::UnevaluatedItemsExtended
                | Rule::UnevaluatedPropertiesAdded
                | Rule::UnevaluatedPropertiesExtended
                | Rule::MaxContainsIncreased
                | Rule::MaxContainsRemoved
                | Rule::MinContainsDecreased
                | Rule::MinContainsRemoved
        )
    }
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
